//! The Mamba-1 scan op of [`CudaDevice`] (Mamba, Falcon-Mamba, Jamba): operands checked on the host,
//! then `mamba1_scan_f32` (mamba2.cu), token by token. There is no chunked form: the chunked
//! SSD of Mamba-2 needs one decay per head, Mamba-1 has one per state entry.

use super::context::{CudaError, launch};
use super::device::CudaDevice;
use super::device_ops::check_rows;
use super::device_types::{CudaBuf, CudaStep, check_len, cols, invalid};
use super::ops::i32_of;
use super::recurrent::{StateSlots, scan_cfg};
use crate::kernels::device::{Cols, DevResult, Mamba1Params};

/// Largest `d_state` the kernel holds in registers.
const MAX_STATE: usize = super::limits::MAX_STATE_DIM;

impl CudaDevice {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mamba1_scan_op(
        &self,
        step: &CudaStep<'_>,
        states: &mut StateSlots,
        layer: usize,
        (x, dt): (&CudaBuf, &CudaBuf),
        bc: Cols<'_, CudaBuf>,
        p: &Mamba1Params<'_, Self>,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        let seqs = step.seqs()?;
        let (t, n, inner) = (seqs.num_tokens, p.d_state, x.width());
        for (b, what) in [(x, "mamba1 x"), (dt, "mamba1 dt")] {
            b.f32(what)?;
            check_rows(b.rows(), t, what)?;
            if b.width() != inner {
                return invalid(format!(
                    "{what}: {} columns for {inner} channels",
                    b.width()
                ));
            }
        }
        let (bca, bc_stride) = cols(bc, "mamba1 B|C")?;
        check_rows(bc.buf.rows(), t, "mamba1 B|C")?;
        if bc.width != 2 * n || n == 0 || n > MAX_STATE {
            return invalid(format!(
                "mamba1 B|C of {} columns for d_state {n} (1..={MAX_STATE})",
                bc.width
            ));
        }
        check_len(p.neg_a, inner * n, "mamba1 A")?;
        check_len(p.d, inner, "mamba1 D")?;
        check_len(p.dt_bias, inner, "mamba1 dt bias")?;
        check_len(p.bc_weight, 2 * n, "mamba1 B|C weights")?;
        let (_, ssm_per) = states.shape(layer)?;
        if ssm_per != inner * n {
            return invalid(format!(
                "mamba1 {inner} × {n}: state slots of {ssm_per} floats"
            ));
        }
        out.f32("mamba1 output")?;
        out.set(t, inner, "mamba1")?;
        if t == 0 {
            return Ok(());
        }
        let [start, len, slot] = seqs.chunks();
        let gpu = &self.gpu;
        let launched: Result<(), CudaError> = launch!(
            gpu,
            "mamba1_scan_f32",
            scan_cfg((inner, "channel blocks"), 1, seqs.num_seqs)?,
            x.ptr(),
            dt.ptr(),
            bca,
            i32_of(bc_stride, "B|C stride")?,
            p.neg_a.ptr(),
            p.d.ptr(),
            p.dt_bias.ptr(),
            p.bc_weight.ptr(),
            states.ssm(layer)?,
            start,
            len,
            slot,
            out.ptr(),
            i32_of(inner, "channels")?,
            i32_of(n, "d_state")?
        );
        Ok(launched?)
    }
}

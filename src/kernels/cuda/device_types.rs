//! The associated types of [`CudaDevice`](super::CudaDevice) (activation buffers, linear
//! layers, RoPE tables, the step plan) and the host-side checks every op makes before it
//! launches anything: a kernel takes raw addresses and would otherwise read or write past a
//! buffer.

use super::context::{DevBuf, Gpu};
use super::gemm::DevWeight;
use super::kv_cache::DevPlan;
use super::recurrent::DevSeqs;
use crate::kernels::device::{Cols, DevResult, DeviceError};
use crate::kernels::dtype::{WeightDtype, dtype_size};

/// Activations `[rows, width]` on the device, in f32 or the compute dtype, for up to
/// `capacity` elements (fixed at creation: the token budget times the widest row).
pub struct CudaBuf {
    mem: DevBuf<u8>,
    dtype: WeightDtype,
    capacity: usize,
    rows: usize,
    width: usize,
}

impl CudaBuf {
    /// `rows` (f32, rows of `width`) into this f32 buffer ([`crate::kernels::Device::upload`]).
    pub(super) fn upload(&mut self, gpu: &Gpu, rows: &[f32], width: usize) -> DevResult<()> {
        self.f32("upload")?;
        let n = match rows.len().checked_div(width) {
            Some(n) if n * width == rows.len() => n,
            _ => return invalid(format!("{} values in rows of {width}", rows.len())),
        };
        self.set(n, width, "upload")?;
        let bytes: &[u8] = bytemuck::cast_slice(rows);
        if bytes.is_empty() {
            return Ok(());
        }
        // `self` holds at least `rows.len()` f32 (checked by `set`); the copy returns once the
        // host bytes are staged, so `rows` may go after.
        Ok(gpu.write_bytes(self.ptr(), bytes)?)
    }

    /// This f32 buffer's rows on the host ([`crate::kernels::Device::download`]).
    pub(super) fn download(&self, gpu: &Gpu) -> DevResult<Vec<f32>> {
        self.f32("download")?;
        let mut out = vec![0.0f32; self.len()];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        gpu.download_into(self.mem(), bytes)?;
        Ok(out)
    }

    /// An empty `[0, width]` buffer over `mem`, which holds `capacity` elements of `dtype`.
    pub(super) fn new(mem: DevBuf<u8>, dtype: WeightDtype, capacity: usize, width: usize) -> Self {
        Self {
            mem,
            dtype,
            capacity,
            rows: 0,
            width,
        }
    }

    /// The bytes under the buffer (all of its capacity).
    pub(super) fn mem(&self) -> &DevBuf<u8> {
        &self.mem
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn dtype(&self) -> WeightDtype {
        self.dtype
    }

    pub(super) fn ptr(&self) -> u64 {
        self.mem.ptr()
    }

    pub(super) fn elem(&self) -> usize {
        dtype_size(self.dtype)
    }

    /// Elements currently held.
    pub(super) fn len(&self) -> usize {
        self.rows * self.width
    }

    /// Fails unless the buffer holds f32 values.
    pub(super) fn f32(&self, what: &str) -> DevResult<&Self> {
        if self.dtype != WeightDtype::F32 {
            return invalid(format!(
                "{what}: an f32 buffer is needed, got {:?}",
                self.dtype
            ));
        }
        Ok(self)
    }

    /// Makes the buffer `[rows, width]` if that fits its capacity (before anything writes it).
    pub(super) fn set(&mut self, rows: usize, width: usize, what: &str) -> DevResult<()> {
        match rows.checked_mul(width) {
            Some(n) if n <= self.capacity => {
                (self.rows, self.width) = (rows, width);
                Ok(())
            }
            _ => invalid(format!(
                "{what}: [{rows}, {width}] output past a buffer of {} elements",
                self.capacity
            )),
        }
    }
}

pub(super) fn invalid<T>(m: String) -> DevResult<T> {
    Err(DeviceError::Invalid(m))
}

/// Device address of column `col` of row 0 and the row stride (elements) of f32 columns.
pub(super) fn cols(c: Cols<'_, CudaBuf>, what: &str) -> DevResult<(u64, usize)> {
    let b = c.buf.f32(what)?;
    if c.col + c.width > b.width {
        return invalid(format!(
            "{what}: columns {}..{} of {}-wide rows",
            c.col,
            c.col + c.width,
            b.width
        ));
    }
    Ok((b.ptr() + (c.col * 4) as u64, b.width))
}

/// Checks a gated activation's input `gate_up` (f32 `[T, 2I]`, gate then up) and sizes its
/// output `out` `[T, I]`: (T, I).
pub(super) fn glu_shape(
    gate_up: &CudaBuf,
    out: &mut CudaBuf,
    what: &str,
) -> DevResult<(usize, usize)> {
    gate_up.f32(what)?;
    if !gate_up.width().is_multiple_of(2) {
        return invalid(format!("{what} over {}-wide rows", gate_up.width()));
    }
    let (rows, inter) = (gate_up.rows(), gate_up.width() / 2);
    out.set(rows, inter, what)?;
    Ok((rows, inter))
}

/// Fails unless `v` has `n` values.
pub(super) fn check_len(v: &DevBuf<f32>, n: usize, what: &str) -> DevResult<()> {
    if v.len() != n {
        return invalid(format!("{what}: {} values, {n} expected", v.len()));
    }
    Ok(())
}

/// A linear layer: the weight in the compute dtype and an optional f32 bias.
pub struct CudaLinear {
    pub(super) w: DevWeight,
    pub(super) bias: Option<DevBuf<f32>>,
}

/// A RoPE table: `rotary_dim / 2` inverse frequencies.
pub struct CudaRope {
    pub(super) inv_freq: DevBuf<f32>,
    /// cos and sin times it ([`crate::kernels::rope::Rope::scale`]).
    pub(super) scale: f32,
}

/// One forward's plan on the device, and its chunks' state slots for recurrent models.
pub struct CudaStep<'a> {
    pub(super) plan: DevPlan,
    pub(super) seqs: Option<DevSeqs>,
    /// The step's token ids on the host (a host-side table's gather).
    pub(super) tokens: &'a [u32],
}

impl<'a> CudaStep<'a> {
    pub(super) fn new(plan: DevPlan, seqs: Option<DevSeqs>, tokens: &'a [u32]) -> Self {
        Self { plan, seqs, tokens }
    }

    pub(super) fn seqs(&self) -> DevResult<&DevSeqs> {
        self.seqs
            .as_ref()
            .ok_or_else(|| DeviceError::Invalid("recurrent op without state slots".into()))
    }
}

/// Fails unless `x` and `y` are f32 buffers of one shape.
pub(super) fn same_f32(x: &CudaBuf, y: &CudaBuf, what: &str) -> DevResult<()> {
    x.f32(what)?;
    y.f32(what)?;
    if (x.rows, x.width) != (y.rows, y.width) {
        return invalid(format!(
            "{what}: [{}, {}] and [{}, {}]",
            x.rows, x.width, y.rows, y.width
        ));
    }
    Ok(())
}

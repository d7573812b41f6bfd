//! The CPU's capture staging: captured rows encoded into the file dtype, `[rows, K, H]`, with
//! the finite-and-non-empty guard checked in the same pass over each row.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::kernels::RowFault;
use crate::kernels::device::{CaptureSpec, Captured, DevResult, DeviceError};
use crate::kernels::dtype::OutputDtype;
use crate::kernels::fp8::{SCALE_BYTES, quantize_row};

/// Rows per rayon task of the capture pass.
const ROWS_PER_TASK: usize = 32;

/// Captured rows in the file dtype and what the guard refused.
pub struct CpuCapture {
    data: Vec<u8>,
    /// The last step's bytes, handed back by the runner once cut into requests
    /// ([`Self::recycle`]): the next step writes into them instead of fresh pages (a fresh
    /// zeroed buffer of tens of MB per step had cost ~3% of a bf16 run in page faults).
    spare: Vec<u8>,
    /// Slots captured since [`Self::begin`]; a reused buffer holds old bytes, so the columns
    /// of a slot not captured are zeroed in [`Self::finish`], as a fresh buffer's would be.
    written: Vec<bool>,
    layers: usize,
    hidden: usize,
    dtype: OutputDtype,
    /// Per slot: check for all-zero rows (see [`CaptureSpec`]); `None`: no guard.
    guard: Option<Vec<bool>>,
    refused: Vec<(usize, usize, RowFault)>,
}

impl CpuCapture {
    pub fn new(spec: CaptureSpec) -> Self {
        Self {
            data: Vec::new(),
            spare: Vec::new(),
            written: vec![false; spec.layers],
            layers: spec.layers,
            hidden: spec.hidden,
            dtype: spec.dtype,
            guard: spec.guard,
            refused: Vec::new(),
        }
    }

    pub fn begin(&mut self) {
        self.data.clear();
        self.refused.clear();
        self.written.fill(false);
    }

    /// Takes back bytes an earlier [`Self::finish`] handed over, for the next step.
    pub fn recycle(&mut self, bytes: Vec<u8>) {
        crate::kernels::host_copy::keep_larger(&mut self.spare, bytes);
    }

    /// Rows `x` (`width` wide, f32) as slot `slot`. fp8 rows are staged in f32 (a token's
    /// scale needs all K slots) and quantized in [`Self::finish`]; the guard sees the f32
    /// values, before quantization.
    pub fn capture(&mut self, slot: usize, x: &[f32], width: usize) -> DevResult<()> {
        let (k, h) = (self.layers, self.hidden);
        if slot >= k || width != h || h == 0 {
            return Err(DeviceError::Invalid(format!(
                "capture slot {slot} of {k}, rows {width} wide (hidden {h})"
            )));
        }
        let es = staged_size(self.dtype);
        let rows = x.len() / h;
        let bytes = rows * k * h * es;
        if self.data.is_empty() {
            // finish handed the last buffer over: the spare one it came back as, else fresh
            // calloc'd pages (zero without a memset pass over tens of MB). Every byte of a
            // captured slot is written below.
            let mut spare = std::mem::take(&mut self.spare);
            if spare.capacity() >= bytes {
                spare.resize(bytes, 0);
                self.data = spare;
            } else {
                self.data = vec![0; bytes];
            }
        } else if self.data.len() < bytes {
            self.data.resize(bytes, 0);
        }
        self.written[slot] = true;
        let (dtype, zero_check) = (self.dtype, self.guard.as_ref().map(|g| g[slot]));
        // Rows in parallel (this pass was serial on the pool's first thread).
        let refused: Vec<_> = self.data[..bytes]
            .par_chunks_mut(k * h * es * ROWS_PER_TASK)
            .zip(x.par_chunks(h * ROWS_PER_TASK))
            .enumerate()
            .flat_map_iter(|(task, (dsts, src))| {
                let mut refused = Vec::new();
                let dsts = dsts.chunks_exact_mut(k * h * es);
                for (i, (row, dst)) in src.chunks_exact(h).zip(dsts).enumerate() {
                    let out = &mut dst[slot * h * es..(slot + 1) * h * es];
                    let (bad, nonzero) = encode_into(row, dtype, out);
                    if let Some(fault) = zero_check.and_then(|z| RowFault::of(bad, nonzero, z)) {
                        refused.push((task * ROWS_PER_TASK + i, slot, fault));
                    }
                }
                refused
            })
            .collect();
        self.refused.extend(refused);
        Ok(())
    }

    /// The `[rows, K, H]` bytes (fp8: each row's codes then its scale) and the refused rows
    /// in row then slot order.
    pub fn finish(&mut self, rows: usize) -> Captured {
        let width = self.layers * self.hidden;
        self.zero_unwritten();
        let bytes = if self.dtype == OutputDtype::Fp8 {
            let mut staged = std::mem::take(&mut self.data);
            staged.resize(rows * width * 4, 0);
            let codes = quantize_rows(&staged, width);
            self.recycle(staged);
            codes
        } else {
            let mut bytes = std::mem::take(&mut self.data);
            bytes.resize(rows * width * self.dtype.size(), 0);
            bytes
        };
        let mut refused = std::mem::take(&mut self.refused);
        refused.sort_by_key(|&(r, k, _)| (r, k));
        Captured { bytes, refused }
    }

    /// Zeroes the columns of every slot not captured this step (a reused buffer's old bytes).
    fn zero_unwritten(&mut self) {
        let (k, slot_bytes) = (self.layers, self.hidden * staged_size(self.dtype));
        if self.written.iter().all(|&w| w) || k * slot_bytes == 0 {
            return;
        }
        for row in self.data.chunks_exact_mut(k * slot_bytes) {
            for (slot, _) in self.written.iter().enumerate().filter(|(_, w)| !**w) {
                row[slot * slot_bytes..(slot + 1) * slot_bytes].fill(0);
            }
        }
    }
}

/// Bytes per staged value: fp8 is staged as f32.
fn staged_size(dtype: OutputDtype) -> usize {
    match dtype {
        OutputDtype::Fp8 => 4,
        d => d.size(),
    }
}

/// Little-endian f32 rows of `width` values -> fp8 rows (codes, then the token's scale).
fn quantize_rows(staged: &[u8], width: usize) -> Vec<u8> {
    let row_out = width + SCALE_BYTES;
    let mut out = vec![0u8; staged.len() / 4 / width.max(1) * row_out];
    let mut values = vec![0f32; width];
    for (src, dst) in staged
        .chunks_exact(width * 4)
        .zip(out.chunks_exact_mut(row_out))
    {
        for (v, b) in values.iter_mut().zip(src.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        quantize_row(&values, dst);
    }
    out
}

/// f32 values to little-endian bytes of `dtype` (round to nearest even, as torch), and in
/// the same pass the guard's two flags of the values as written (an f16 overflow is an
/// infinity in the file, an underflow a zero): (any NaN / Inf, any non-zero value).
fn encode_into(vals: &[f32], dtype: OutputDtype, out: &mut [u8]) -> (bool, bool) {
    let (mut bad, mut nonzero) = (false, false);
    let mut see = |v: f32| {
        bad |= !v.is_finite();
        nonzero |= v != 0.0;
    };
    match dtype {
        // fp8 rows are staged in f32 and quantized per token once all K slots are there.
        OutputDtype::F32 | OutputDtype::Fp8 => {
            for (v, o) in vals.iter().zip(out.chunks_exact_mut(4)) {
                see(*v);
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        OutputDtype::Bf16 => {
            for (v, o) in vals.iter().zip(out.chunks_exact_mut(2)) {
                let b = bf16::from_f32(*v);
                see(b.to_f32());
                o.copy_from_slice(&b.to_le_bytes());
            }
        }
        OutputDtype::F16 => {
            for (v, o) in vals.iter().zip(out.chunks_exact_mut(2)) {
                let x = f16::from_f32(*v);
                see(x.to_f32());
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
    (bad, nonzero)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(dtype: OutputDtype, guard: Option<Vec<bool>>, rows: &[[f32; 2]]) -> Captured {
        let spec = CaptureSpec {
            layers: 2,
            hidden: 2,
            rows: 0,
            dtype,
            guard,
        };
        let mut c = CpuCapture::new(spec);
        c.begin();
        let x: Vec<f32> = rows.iter().flatten().copied().collect();
        c.capture(0, &x, 2).unwrap();
        c.capture(1, &x, 2).unwrap();
        c.finish(rows.len())
    }

    /// A step writing into the previous step's recycled bytes gives the bytes a fresh buffer
    /// would: more rows, fewer rows, a slot not captured (zero), every dtype.
    #[test]
    fn recycled_buffer_gives_the_bytes_of_a_fresh_one() {
        let spec = |dtype| CaptureSpec {
            layers: 3,
            hidden: 4,
            rows: 0,
            dtype,
            guard: None,
        };
        let rows = |n: usize, seed: f32| -> Vec<f32> {
            (0..n * 4).map(|i| seed + i as f32 * 0.37).collect()
        };
        let step = |c: &mut CpuCapture, n: usize, slots: &[usize], seed: f32| {
            c.begin();
            for &slot in slots {
                c.capture(slot, &rows(n, seed + slot as f32), 4).unwrap();
            }
            c.finish(n).bytes
        };
        for dtype in [
            OutputDtype::F32,
            OutputDtype::Bf16,
            OutputDtype::F16,
            OutputDtype::Fp8,
        ] {
            let mut reused = CpuCapture::new(spec(dtype));
            for (n, slots, seed) in [
                (5, &[0, 1, 2][..], 1.0),
                (9, &[0, 2][..], -3.0),
                (2, &[1][..], 7.0),
                (9, &[][..], 0.5),
            ] {
                let fresh = step(&mut CpuCapture::new(spec(dtype)), n, slots, seed);
                let got = step(&mut reused, n, slots, seed);
                assert_eq!(got, fresh, "{dtype:?}: {n} rows, slots {slots:?}");
                reused.recycle(got);
            }
        }
    }

    #[test]
    fn guard_refuses_non_finite_rows_and_zero_rows_where_checked() {
        use RowFault::*;
        let rows = [
            [1.0, f32::NAN],
            [0.0, -0.0],
            [1.0, 2.0],
            [f32::INFINITY, 0.0],
        ];
        let got = capture(OutputDtype::F32, Some(vec![false, true]), &rows);
        let want = vec![
            (0, 0, NonFinite),
            (0, 1, NonFinite),
            (1, 1, AllZero),
            (3, 0, NonFinite),
            (3, 1, NonFinite),
        ];
        assert_eq!(got.refused, want);
        assert_eq!(got.bytes.len(), 4 * 2 * 2 * 4);
        assert!(capture(OutputDtype::F32, None, &rows).refused.is_empty());
    }

    #[test]
    fn bf16_rounds_like_torch() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
        let mut out = [0u8; 4];
        encode_into(&[1.0 + 1.0 / 256.0, -2.0], OutputDtype::Bf16, &mut out);
        assert_eq!(out, [0x80, 0x3f, 0x00, 0xc0]);
    }

    #[test]
    fn guard_sees_the_values_as_written() {
        // 70000 overflows f16 to infinity; 1e-9 underflows it to zero.
        let got = capture(OutputDtype::F16, Some(vec![true, true]), &[[70000.0, 1.0]]);
        assert_eq!(got.refused[0].2, RowFault::NonFinite);
        let got = capture(OutputDtype::F16, Some(vec![true, true]), &[[1e-9, 0.0]]);
        assert_eq!(got.refused[0].2, RowFault::AllZero);
        let got = capture(OutputDtype::Bf16, Some(vec![true, true]), &[[1e-9, 0.0]]);
        assert!(got.refused.is_empty());
        assert_eq!(got.bytes.len(), 2 * 2 * 2);
    }
}

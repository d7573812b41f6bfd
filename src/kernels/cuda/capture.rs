//! Captured hidden states leave the device every forward, already in the file dtype, without
//! stalling the compute stream.
//!
//! For each captured layer: its `[T, H]` f32 rows converted to the output dtype (capture.cu;
//! the same pass sets the guard's per-row flags: NaN / Inf, any non-zero) into the layer's slot of a staging buffer `[K, max_tokens, H]`
//! (on the compute stream, so later layers may overwrite the residual stream at once), an event
//! recorded after it, and on the copy stream — which waits for that event only — a strided 2-D
//! download into pinned host memory laid out `[max_tokens, K, H]`, i.e. already in
//! `BatchOutput.captured` order. A 16-bit file moves half the bytes of f32 over PCIe and needs
//! no host conversion. The compute stream never waits for a download. [`Capture::finish`]
//! synchronises the copy stream once, at the end of the forward, and copies the bytes out.
//! Device and pinned memory are O(token budget × K × H), allocated once.
//!
//! fp8 (a token's scale spans its K rows): slots are staged in f32 (the guard sees the values
//! before quantization), and [`Capture::finish`] quantizes every row on the device
//! (`capture_quantize_fp8`) into the host row layout (codes then scale, `kernels::fp8`) and
//! downloads it in one copy.

use std::sync::Arc;

use super::context::{CudaError, CudaResult, DevBuf, Gpu, launch, rows_cfg};
use super::driver::{DeviceApi, Event, Stream};
use super::ops::i32_of;
use crate::kernels::RowFault;
use crate::kernels::device::{CaptureSpec, Captured};
use crate::kernels::dtype::OutputDtype;

/// Page-locked host bytes (cached, not write-combined: the host reads them).
struct PinnedBuf {
    ptr: *mut u8,
    len: usize,
    dev: Arc<dyn DeviceApi>,
}

// SAFETY: the allocation is owned exclusively by this value and freed once, in Drop.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    fn new(dev: &Arc<dyn DeviceApi>, len: usize) -> CudaResult<Self> {
        let len = len.max(1);
        let ptr = dev.alloc_pinned(len)?;
        Ok(Self {
            ptr,
            len,
            dev: dev.clone(),
        })
    }

    /// The first `n` bytes, in place of `out`'s. The caller guarantees no download into them
    /// is in flight.
    fn read_into(&self, n: usize, out: &mut Vec<u8>) {
        assert!(n <= self.len, "pinned read of {n} bytes past {}", self.len);
        // SAFETY: `ptr` holds `len` bytes (zeroed or written by finished downloads).
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, n) };
        crate::kernels::host_copy::copy_into(out, bytes);
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc_pinned(len)` in `new`, freed once; downloads into it
        // were synchronised by `Capture`'s Drop.
        unsafe { self.dev.free_pinned(self.ptr, self.len) };
    }
}

/// Staging and pinned buffers of the captured layers, in the output dtype.
pub struct Capture {
    layers: usize,
    hidden: usize,
    max_tokens: usize,
    dtype: OutputDtype,
    /// `[K, max_tokens, H]` elements of `dtype` (f32 for fp8), as bytes.
    staging: DevBuf<u8>,
    /// fp8 only: `[max_tokens]` rows of K × H codes and a 4-byte scale.
    quantized: DevBuf<u8>,
    /// The guard's flags of each (row, slot), `[max_tokens, K]` (capture.cu).
    flags: DevBuf<u32>,
    /// Per slot: check for all-zero rows; `None`: no guard.
    guard: Option<Vec<bool>>,
    pinned: PinnedBuf,
    /// The last step's bytes, handed back by the runner once cut into requests
    /// ([`Self::recycle`]): the next step is copied into them instead of fresh pages (the
    /// faults of a fresh buffer cost several times the copy, with the GPU waiting).
    spare: Vec<u8>,
    ready: Event,
    dev: Arc<dyn DeviceApi>,
}

impl Capture {
    /// Buffers for `layers` captured layers of `hidden` values and up to `max_tokens` rows
    /// of `dtype`.
    pub fn new(gpu: &Gpu, spec: CaptureSpec) -> CudaResult<Self> {
        let CaptureSpec {
            layers,
            hidden,
            rows: max_tokens,
            dtype,
            guard,
        } = spec;
        let overflow = || CudaError::Invalid("capture staging size overflows".into());
        let total = layers
            .checked_mul(hidden)
            .and_then(|n| n.checked_mul(max_tokens))
            .and_then(|n| n.checked_mul(staged_size(dtype)))
            .ok_or_else(overflow)?;
        let host = dtype
            .row_bytes(layers, hidden)
            .and_then(|n| n.checked_mul(max_tokens))
            .ok_or_else(overflow)?;
        let quantized = if dtype == OutputDtype::Fp8 { host } else { 0 };
        let pinned = PinnedBuf::new(&gpu.dev, host)?;
        // SAFETY: `pinned` holds `host` bytes; zero them so that a read never sees garbage.
        unsafe { std::ptr::write_bytes(pinned.ptr, 0, host) };
        Ok(Self {
            layers,
            hidden,
            max_tokens,
            dtype,
            staging: gpu.zeros(total)?,
            quantized: gpu.zeros(quantized)?,
            flags: gpu.zeros(layers.saturating_mul(max_tokens))?,
            guard,
            pinned,
            spare: Vec::new(),
            ready: gpu.dev.new_event()?,
            dev: gpu.dev.clone(),
        })
    }

    /// Values per captured row.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Call before a forward: the previous forward's downloads (even of a failed one) are
    /// done before staging is written again.
    pub fn begin(&self) -> CudaResult<()> {
        self.dev.synchronize(Stream::Copy)
    }

    /// Captures rows `x[0..t]` (`[t, hidden]` f32 on the device) as capture slot `k`,
    /// converted to the output dtype and flagged for the guard on the compute stream.
    pub fn capture(&self, gpu: &Gpu, k: usize, x: u64, t: usize) -> CudaResult<()> {
        let dst = self.stage(k, t)?;
        if t == 0 {
            return Ok(());
        }
        let name = match self.dtype {
            OutputDtype::F32 | OutputDtype::Fp8 => "capture_rows_f32",
            OutputDtype::Bf16 => "capture_rows_bf16",
            OutputDtype::F16 => "capture_rows_f16",
        };
        let flags = self.flags.ptr_at(k, (t - 1) * self.layers + 1)?;
        let hidden = i32_of(self.hidden, "hidden")?;
        let stride = self.layers as i64;
        launch!(gpu, name => "capture_rows_f32", rows_cfg(t, 256)?, x, dst, hidden, flags, stride)?;
        if self.dtype == OutputDtype::Fp8 {
            // Quantized and downloaded in `finish`, once all K slots are staged.
            return Ok(());
        }
        self.download(gpu, k, t)
    }

    /// Bytes of one staged row of one layer.
    fn row_bytes(&self) -> usize {
        self.hidden * staged_size(self.dtype)
    }

    /// Bytes of one token's row in host memory (fp8: codes and scale).
    fn host_row_bytes(&self) -> usize {
        self.dtype
            .row_bytes(self.layers, self.hidden)
            .unwrap_or(usize::MAX)
    }

    /// fp8: quantizes rows `0..t` of the staged slots on the compute stream and queues their
    /// download (one contiguous copy) on the copy stream.
    fn quantize_and_download(&self, gpu: &Gpu, t: usize) -> CudaResult<()> {
        if t == 0 {
            return Ok(());
        }
        let bytes = t * self.host_row_bytes();
        let staged = self.layers * self.max_tokens * self.row_bytes();
        let (src, dst) = (
            self.staging.ptr_at(0, staged)?,
            self.quantized.ptr_at(0, bytes)?,
        );
        let layers = i32_of(self.layers, "layers")?;
        let hidden = i32_of(self.hidden, "hidden")?;
        let max_tokens = self.max_tokens as i64;
        let cfg = rows_cfg(t, 256)?;
        launch!(
            gpu,
            "capture_quantize_fp8",
            cfg,
            src,
            dst,
            layers,
            hidden,
            max_tokens
        )?;
        self.dev.record(&self.ready, Stream::Compute)?;
        self.dev.wait(Stream::Copy, &self.ready)?;
        // SAFETY: `bytes` <= max_tokens rows of both `quantized` (checked by ptr_at) and
        // `pinned` (allocated with the same row size), as one row of `bytes`.
        unsafe {
            gpu.dev
                .copy_dtoh_2d(Stream::Copy, self.pinned.ptr, bytes, dst, bytes, bytes, 1)
        }
    }

    /// Device address of slot `k`'s first row, checking that `t` rows fit.
    fn stage(&self, k: usize, t: usize) -> CudaResult<u64> {
        if k >= self.layers || t > self.max_tokens {
            return Err(CudaError::Invalid(format!(
                "capture slot {k} of {} with {t} rows (budget {})",
                self.layers, self.max_tokens
            )));
        }
        let row = self.row_bytes();
        self.staging.ptr_at(k * self.max_tokens * row, t * row)
    }

    /// Orders the copy stream after the compute so far and queues the download of slot `k`.
    fn download(&self, gpu: &Gpu, k: usize, t: usize) -> CudaResult<()> {
        if t == 0 {
            return Ok(());
        }
        self.dev.record(&self.ready, Stream::Compute)?;
        self.dev.wait(Stream::Copy, &self.ready)?;
        let row = self.row_bytes();
        let src = self.stage(k, t)?;
        // SAFETY: source rows k·max_tokens.. + t of staging (checked in `stage`), destination
        // rows 0..t of pinned `[max_tokens, K, H]` at column block k: inside both buffers
        // (pinned holds max_tokens · K · row bytes).
        unsafe {
            gpu.dev.copy_dtoh_2d(
                Stream::Copy,
                self.pinned.ptr.add(k * row),
                self.layers * row,
                src,
                row,
                row,
                t,
            )
        }
    }

    /// Takes back bytes an earlier [`Self::finish`] handed over, for the next step.
    pub fn recycle(&mut self, bytes: Vec<u8>) {
        crate::kernels::host_copy::keep_larger(&mut self.spare, bytes);
    }

    /// Waits for this forward's downloads and returns the `[t, K, H]` rows as little-endian
    /// bytes of the output dtype, with the rows the guard refused.
    pub fn finish(&mut self, gpu: &Gpu, t: usize) -> CudaResult<Captured> {
        if t > self.max_tokens {
            self.dev.synchronize(Stream::Copy)?;
            return Err(CudaError::Invalid(format!(
                "{t} rows past the capture budget"
            )));
        }
        if self.dtype == OutputDtype::Fp8 {
            self.quantize_and_download(gpu, t)?;
        }
        self.dev.synchronize(Stream::Copy)?;
        let mut bytes = std::mem::take(&mut self.spare);
        self.pinned.read_into(t * self.host_row_bytes(), &mut bytes);
        let mut refused = Vec::new();
        if let Some(zero_check) = &self.guard {
            let flags = gpu.download(&self.flags, t * self.layers)?;
            for (i, &f) in flags.iter().enumerate() {
                let (row, slot) = (i / self.layers, i % self.layers);
                if let Some(fault) = RowFault::of(f & 1 != 0, f & 2 != 0, zero_check[slot]) {
                    refused.push((row, slot, fault));
                }
            }
        }
        Ok(Captured { bytes, refused })
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // Downloads still in flight write into `pinned`: finish them before it is freed.
        let _ = self.dev.synchronize(Stream::Copy);
    }
}

/// Bytes per staged value: fp8 is staged as f32 (quantized per token in `finish`).
fn staged_size(dtype: OutputDtype) -> usize {
    match dtype {
        OutputDtype::Fp8 => 4,
        d => d.size(),
    }
}

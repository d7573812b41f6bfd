//! Captured hidden states leave the device every forward without stalling the compute stream.
//!
//! For each captured layer: a device-to-device copy of its `[T, H]` rows into the layer's slot
//! of a staging buffer `[K, max_tokens, H]` (on the compute stream, so later layers may
//! overwrite the residual stream at once), an event recorded after it, and on the copy stream —
//! which waits for that event only — a strided 2-D download into pinned host memory laid out
//! `[max_tokens, K, H]`, i.e. already in `BatchOutput.captured` order. The compute stream never
//! waits for a download. [`Capture::finish`] synchronises the copy stream once, at the end of
//! the forward, and copies the rows out. Device and pinned memory are O(token budget × K × H),
//! allocated once.

use std::sync::Arc;

use cudarc::driver::sys::{CUDA_MEMCPY2D, CUmemorytype};
use cudarc::driver::{CudaContext, CudaEvent};

use super::context::{CudaError, CudaResult, DevBuf, Gpu};
use super::ops;

/// Page-locked host memory (cached, not write-combined: the host reads it).
struct PinnedBuf {
    ptr: *mut f32,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is owned exclusively by this value and freed once, in Drop.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> CudaResult<Self> {
        ctx.bind_to_thread()?;
        let bytes = len.max(1) * std::mem::size_of::<f32>();
        // SAFETY: plain cuMemHostAlloc; flags 0 = cached, page-locked.
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes, 0) }? as *mut f32;
        if ptr.is_null() {
            return Err(CudaError::Invalid("cuMemHostAlloc returned null".into()));
        }
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    /// The first `n` values. The caller guarantees no download into them is in flight.
    fn read(&self, n: usize) -> Vec<f32> {
        assert!(n <= self.len, "pinned read of {n} values past {}", self.len);
        // SAFETY: `ptr` holds `len` f32 values (zeroed or written by finished downloads).
        unsafe { std::slice::from_raw_parts(self.ptr, n) }.to_vec()
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once; downloads into it were
        // synchronised by `Capture`'s Drop.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr as _) };
    }
}

/// Staging and pinned buffers of the captured layers.
pub struct Capture {
    layers: usize,
    hidden: usize,
    max_tokens: usize,
    staging: DevBuf<f32>,
    pinned: PinnedBuf,
    ready: CudaEvent,
    copy_stream: Arc<cudarc::driver::CudaStream>,
}

impl Capture {
    /// Buffers for `layers` captured layers of `hidden` values and up to `max_tokens` rows.
    pub fn new(gpu: &Gpu, layers: usize, hidden: usize, max_tokens: usize) -> CudaResult<Self> {
        let total = layers
            .checked_mul(hidden)
            .and_then(|n| n.checked_mul(max_tokens))
            .ok_or_else(|| CudaError::Invalid("capture staging size overflows".into()))?;
        let pinned = PinnedBuf::new(&gpu.ctx, total)?;
        // SAFETY: `pinned` holds `total` f32; zero them so that a read never sees garbage.
        unsafe { std::ptr::write_bytes(pinned.ptr, 0, total) };
        Ok(Self {
            layers,
            hidden,
            max_tokens,
            staging: gpu.zeros(total)?,
            pinned,
            ready: gpu.ctx.new_event(None)?,
            copy_stream: gpu.copy_stream.clone(),
        })
    }

    /// Call before a forward: the previous forward's downloads (even of a failed one) are
    /// done before staging is written again.
    pub fn begin(&self) -> CudaResult<()> {
        Ok(self.copy_stream.synchronize()?)
    }

    /// Captures rows `x[0..t]` (`[t, hidden]` f32 on the device) as capture slot `k`.
    pub fn capture(&self, gpu: &Gpu, k: usize, x: u64, t: usize) -> CudaResult<()> {
        let dst = self.stage(k, t)?;
        ops::copy_f32(gpu, x, dst, t * self.hidden)?;
        self.download(gpu, k, t)
    }

    /// Captures `a + b` (a split residual: `hidden + residual`, DESIGN.md §1.1) as slot `k`.
    pub fn capture_sum(&self, gpu: &Gpu, k: usize, a: u64, b: u64, t: usize) -> CudaResult<()> {
        let dst = self.stage(k, t)?;
        ops::add_into(gpu, a, b, dst, t * self.hidden)?;
        self.download(gpu, k, t)
    }

    fn stage(&self, k: usize, t: usize) -> CudaResult<u64> {
        if k >= self.layers || t > self.max_tokens {
            return Err(CudaError::Invalid(format!(
                "capture slot {k} of {} with {t} rows (budget {})",
                self.layers, self.max_tokens
            )));
        }
        self.staging
            .ptr_at(k * self.max_tokens * self.hidden, t * self.hidden)
    }

    /// Orders the copy stream after the compute so far and queues the download of slot `k`.
    fn download(&self, gpu: &Gpu, k: usize, t: usize) -> CudaResult<()> {
        if t == 0 {
            return Ok(());
        }
        self.ready.record(&gpu.stream)?;
        self.copy_stream.wait(&self.ready)?;
        let row = self.hidden * 4;
        let copy = CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: self.stage(k, t)?,
            srcArray: std::ptr::null_mut(),
            srcPitch: row,
            dstXInBytes: k * row,
            dstY: 0,
            dstMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
            dstHost: self.pinned.ptr as *mut std::ffi::c_void,
            dstDevice: 0,
            dstArray: std::ptr::null_mut(),
            dstPitch: self.layers * row,
            WidthInBytes: row,
            Height: t,
        };
        gpu.ctx.bind_to_thread()?;
        // SAFETY: source rows k·max_tokens.. + t of staging (checked in `stage`), destination
        // rows 0..t of pinned `[max_tokens, K, H]` at column block k: inside both buffers.
        unsafe {
            cudarc::driver::sys::cuMemcpy2DAsync_v2(&copy, self.copy_stream.cu_stream())
                .result()?;
        }
        Ok(())
    }

    /// Waits for this forward's downloads and returns the `[t, K, H]` rows.
    pub fn finish(&self, t: usize) -> CudaResult<Vec<f32>> {
        self.copy_stream.synchronize()?;
        if t > self.max_tokens {
            return Err(CudaError::Invalid(format!(
                "{t} rows past the capture budget"
            )));
        }
        Ok(self.pinned.read(t * self.layers * self.hidden))
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // Downloads still in flight write into `pinned`: finish them before it is freed.
        let _ = self.copy_stream.synchronize();
    }
}

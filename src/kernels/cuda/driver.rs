//! The narrow interface between the CUDA backend and a device: everything the backend asks of
//! the hardware goes through [`DeviceApi`]. cudarc implements it on a real GPU (feature
//! `cuda`, `driver_cudarc`); the host emulator implements it on host memory with the project's
//! own kernels compiled for the CPU (feature `cuda-emu`, `driver_emu`), so the whole backend
//! — weight upload, planning, every launch and its arguments, the capture through the copy
//! stream — runs in CI without a GPU.
//!
//! Addresses are `CUdeviceptr` values ([`DevPtr`]); there are two streams ([`Stream`]):
//! work on one stream runs in issue order, across streams only events order it.

use std::any::Any;
use std::ffi::c_void;

use super::api::DeviceInfo;
use super::context::CudaResult;
use crate::kernels::dtype::WeightDtype;

/// A device address.
pub type DevPtr = u64;

/// The backend's two streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// All compute, in issue order.
    Compute,
    /// Downloads of captured rows only.
    Copy,
}

/// A kernel launch's geometry (cuLaunchKernel's grid, block and dynamic shared bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid_dim: (u32, u32, u32),
    pub block_dim: (u32, u32, u32),
    pub shared_mem_bytes: u32,
}

/// cuBLAS `cublasOperation_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    N,
    T,
}

/// One `cublasGemmEx` call with `CUBLAS_COMPUTE_32F`, column-major:
/// `C[m×n] = alpha · op(A)[m×k] · op(B)[k×n] + beta · C`, A / B in `ab_type`, C in f32.
#[derive(Debug, Clone, Copy)]
pub struct GemmEx {
    pub transa: Op,
    pub transb: Op,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: f32,
    pub a: DevPtr,
    pub lda: i32,
    pub b: DevPtr,
    pub ldb: i32,
    pub ab_type: WeightDtype,
    pub beta: f32,
    pub c: DevPtr,
    pub ldc: i32,
}

/// An event of a [`DeviceApi`] (its own type inside).
pub struct Event(pub Box<dyn Any + Send + Sync>);

/// What the CUDA backend needs from a device. Every `unsafe` method takes raw addresses: the
/// caller guarantees that they lie inside live allocations of this device of the sizes named.
pub trait DeviceApi: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    /// `bytes` (> 0) zeroed bytes of device memory.
    fn alloc_zeroed(&self, bytes: usize) -> CudaResult<DevPtr>;
    /// Frees an allocation of `bytes` made by [`DeviceApi::alloc_zeroed`], after the compute
    /// stream's work so far.
    /// # Safety
    /// `ptr` came from `alloc_zeroed(bytes)` and is freed once.
    unsafe fn free(&self, ptr: DevPtr, bytes: usize);
    /// Host → device on `stream`; returns once `src` may be reused.
    /// # Safety
    /// `dst..dst + src.len()` is device memory.
    unsafe fn copy_htod(&self, stream: Stream, dst: DevPtr, src: &[u8]) -> CudaResult<()>;
    /// Device → host after everything issued on `stream`; returns when `dst` is written.
    /// # Safety
    /// `src..src + dst.len()` is device memory.
    unsafe fn copy_dtoh(&self, stream: Stream, src: DevPtr, dst: &mut [u8]) -> CudaResult<()>;
    /// # Safety
    /// Both ranges of `bytes` are device memory.
    unsafe fn copy_dtod(
        &self,
        stream: Stream,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> CudaResult<()>;
    /// # Safety
    /// `ptr..ptr + bytes` is device memory.
    unsafe fn memset_zero(&self, stream: Stream, ptr: DevPtr, bytes: usize) -> CudaResult<()>;
    /// Asynchronous strided device → pinned host copy (cuMemcpy2DAsync): `height` rows of
    /// `width` bytes, `src_pitch` / `dst_pitch` bytes apart.
    /// # Safety
    /// Both regions lie inside their allocations; `dst` is pinned memory of this device that
    /// stays alive until `stream` is synchronised.
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy_dtoh_2d(
        &self,
        stream: Stream,
        dst: *mut u8,
        dst_pitch: usize,
        src: DevPtr,
        src_pitch: usize,
        width: usize,
        height: usize,
    ) -> CudaResult<()>;
    /// `bytes` (> 0) of page-locked host memory.
    fn alloc_pinned(&self, bytes: usize) -> CudaResult<*mut u8>;
    /// # Safety
    /// `ptr` came from `alloc_pinned(bytes)`, no copy into it is in flight, freed once.
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize);
    /// Launches kernel `name` on `stream`. `params` is cuLaunchKernel's `kernelParams`: one
    /// pointer per kernel parameter, to that argument's value; `sizes` are the values' sizes.
    /// # Safety
    /// The arguments are the kernel's parameters in order and every address in them points
    /// into live device memory of the sizes the kernel touches.
    unsafe fn launch(
        &self,
        name: &str,
        cfg: LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
        sizes: &[u32],
    ) -> CudaResult<()>;
    fn new_event(&self) -> CudaResult<Event>;
    /// Records `event` after the work issued so far on `stream`.
    fn record(&self, event: &Event, stream: Stream) -> CudaResult<()>;
    /// Makes `stream`'s later work wait for `event`.
    fn wait(&self, stream: Stream, event: &Event) -> CudaResult<()>;
    /// Blocks until `stream`'s work is done.
    fn synchronize(&self, stream: Stream) -> CudaResult<()>;
    /// cuBLAS gemm_ex on `stream`.
    /// # Safety
    /// A, B and C hold the elements their shapes and leading dimensions reach.
    unsafe fn gemm_ex(&self, stream: Stream, g: &GemmEx) -> CudaResult<()>;
}

//! The device under [`super::CudaDevice`]: [`Gpu`] (a [`DeviceApi`] — a GPU through cudarc or
//! the host emulator — and what it is), typed device buffers and the launch helper.
//!
//! # Streams and ordering
//! All compute is issued on the compute stream, so kernels, GEMMs and copies on it run in issue
//! order and need no synchronisation between them. The copy stream only downloads
//! captured rows; it is ordered after the compute that produced them by an event (see
//! [`super::capture`]). cudarc's automatic per-buffer event tracking is disabled (it would make
//! the compute stream wait for every download of a staging buffer): whoever adds a stream
//! orders it explicitly with events ([`DeviceApi::record`] / [`DeviceApi::wait`]).

use std::marker::PhantomData;
use std::sync::Arc;

use thiserror::Error;

use super::api::{CudaUnavailable, DeviceInfo};
pub use super::driver::LaunchConfig;
use super::driver::{DevPtr, DeviceApi, Event, Stream};
pub(crate) use super::launch_args::launch;
use crate::kernels::{BackendError, DeviceError};

/// A failure of the CUDA runtime stack.
#[derive(Debug, Error)]
pub enum CudaError {
    #[cfg(feature = "cuda")]
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[cfg(feature = "cuda")]
    #[error("cuBLAS: {0}")]
    Blas(#[from] cudarc::cublas::result::CublasError),
    #[error("{0}")]
    Compile(String),
    #[error("kernel `{0}` is not in any loaded module")]
    NoKernel(String),
    #[error("kernel `{kernel}`: {message}")]
    Launch { kernel: String, message: String },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Unavailable(#[from] CudaUnavailable),
    /// A sticky error the emulator raises (the driver's come as [`CudaError::Driver`]).
    #[error("{0}")]
    Lost(String),
}

impl CudaError {
    /// Whether the context is unusable from now on: CUDA reports these once and then fails
    /// every later call on the context, so retrying the step cannot help.
    pub fn is_sticky(&self) -> bool {
        match self {
            #[cfg(feature = "cuda")]
            CudaError::Driver(e) => sticky_driver_error(e),
            CudaError::Lost(_) => true,
            _ => false,
        }
    }
}

/// The driver's sticky (context-corrupting) results, as the CUDA driver API documents them.
#[cfg(feature = "cuda")]
fn sticky_driver_error(e: &cudarc::driver::DriverError) -> bool {
    use cudarc::driver::sys::CUresult as R;
    matches!(
        e.0,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
            | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        if e.is_sticky() {
            BackendError::DeviceLost(format!("cuda: {e}"))
        } else {
            BackendError::Compute(format!("cuda: {e}"))
        }
    }
}

impl From<CudaError> for DeviceError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Invalid(m) => DeviceError::Invalid(m),
            e if e.is_sticky() => DeviceError::Lost(format!("cuda: {e}")),
            other => DeviceError::Failed(format!("cuda: {other}")),
        }
    }
}

pub type CudaResult<T> = Result<T, CudaError>;

/// Checks the libraries and device `ordinal` (the emulated one with `cuda-emu`); never panics,
/// even without a driver.
pub fn probe(ordinal: usize) -> Result<DeviceInfo, CudaUnavailable> {
    // cudarc panics where a symbol is missing from an old driver: report it as an error.
    std::panic::catch_unwind(|| {
        #[cfg(feature = "cuda-emu")]
        return super::driver_emu::info(ordinal);
        #[cfg(not(feature = "cuda-emu"))]
        return super::driver_cudarc::probe(ordinal);
    })
    .unwrap_or_else(|p| {
        Err(CudaUnavailable::Init(format!(
            "the CUDA driver panicked: {}",
            panic_message(p.as_ref())
        )))
    })
}

/// A caught panic's message.
pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

/// The CUDA driver, NVRTC and cuBLAS versions found (none on the emulator).
pub fn versions() -> super::api::CudaVersions {
    #[cfg(feature = "cuda-emu")]
    return super::api::CudaVersions::default();
    #[cfg(not(feature = "cuda-emu"))]
    return super::driver_cudarc::versions();
}

/// One device behind the [`DeviceApi`], and what it is.
pub struct Gpu {
    pub dev: Arc<dyn DeviceApi>,
    pub info: DeviceInfo,
    /// `HSX_CUDA_SYNC=1`: synchronise after every launch, so that an asynchronous fault
    /// (illegal address, ...) names the kernel that caused it.
    pub sync_each_launch: bool,
}

impl Gpu {
    /// Opens device `ordinal`: the GPU through cudarc, or the host emulator with `cuda-emu`.
    pub fn new(ordinal: usize) -> CudaResult<Self> {
        #[cfg(feature = "cuda-emu")]
        let dev: Arc<dyn DeviceApi> = Arc::new(super::driver_emu::EmuDevice::new(ordinal)?);
        #[cfg(not(feature = "cuda-emu"))]
        let dev: Arc<dyn DeviceApi> = Arc::new(super::driver_cudarc::CudarcDevice::new(ordinal)?);
        let info = dev.info().clone();
        let sync_each_launch = std::env::var("HSX_CUDA_SYNC").is_ok_and(|v| v == "1");
        if sync_each_launch {
            tracing::warn!("HSX_CUDA_SYNC=1: synchronising after every kernel launch (slow)");
        }
        Ok(Self {
            dev,
            info,
            sync_each_launch,
        })
    }

    /// An event recorded after everything issued so far on the compute stream.
    pub fn event_after_compute(&self) -> CudaResult<Event> {
        let e = self.dev.new_event()?;
        self.dev.record(&e, Stream::Compute)?;
        Ok(e)
    }

    /// Blocks until the compute stream's work is done.
    pub fn synchronize(&self) -> CudaResult<()> {
        self.dev.synchronize(Stream::Compute)
    }

    /// Allocates `len` zeroed elements.
    pub fn zeros<T: bytemuck::Pod>(&self, len: usize) -> CudaResult<DevBuf<T>> {
        // cuMemAlloc of 0 bytes fails; an empty buffer is still a valid (unused) one.
        let bytes = len
            .max(1)
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| CudaError::Invalid(format!("{len} elements overflow")))?;
        let ptr = self.dev.alloc_zeroed(bytes)?;
        Ok(DevBuf {
            dev: self.dev.clone(),
            ptr,
            bytes,
            len,
            _t: PhantomData,
        })
    }

    /// Copies `host` into a new device buffer.
    pub fn upload<T: bytemuck::Pod>(&self, host: &[T]) -> CudaResult<DevBuf<T>> {
        let mut buf = self.zeros(host.len())?;
        self.write(&mut buf, host)?;
        Ok(buf)
    }

    /// Copies `host` into the start of `dst` on the compute stream (returns once `host` may
    /// be reused).
    pub fn write<T: bytemuck::Pod>(&self, dst: &mut DevBuf<T>, host: &[T]) -> CudaResult<()> {
        if host.len() > dst.len {
            return Err(CudaError::Invalid(format!(
                "upload of {} elements into a buffer of {}",
                host.len(),
                dst.len
            )));
        }
        self.write_bytes(dst.ptr, bytemuck::cast_slice(host))
    }

    /// Copies `bytes` to device address `dst` on the compute stream.
    pub fn write_bytes(&self, dst: DevPtr, bytes: &[u8]) -> CudaResult<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: the callers pass a destination of at least `bytes.len()` bytes (checked).
        unsafe { self.dev.copy_htod(Stream::Compute, dst, bytes) }
    }

    /// Copies the first `len` elements of `src` to the host, waiting for the compute stream.
    pub fn download<T: bytemuck::Pod>(&self, src: &DevBuf<T>, len: usize) -> CudaResult<Vec<T>> {
        let mut out = vec![T::zeroed(); len];
        self.download_into(src, &mut out)?;
        Ok(out)
    }

    /// Fills `dst` with the first `dst.len()` elements of `src`, waiting for the compute
    /// stream.
    pub fn download_into<T: bytemuck::Pod>(
        &self,
        src: &DevBuf<T>,
        dst: &mut [T],
    ) -> CudaResult<()> {
        let len = dst.len();
        if len > src.len {
            return Err(CudaError::Invalid(format!(
                "download of {len} elements from a buffer of {}",
                src.len
            )));
        }
        if len > 0 {
            // SAFETY: `src` holds at least `len` elements (checked).
            unsafe {
                self.dev
                    .copy_dtoh(Stream::Compute, src.ptr, bytemuck::cast_slice_mut(dst))?
            };
        }
        self.synchronize()
    }

    /// Zeroes `bytes` bytes from device address `ptr` on the compute stream.
    pub fn memset_zero(&self, ptr: u64, bytes: usize) -> CudaResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller passes a range inside one live allocation of this device.
        unsafe { self.dev.memset_zero(Stream::Compute, ptr, bytes) }
    }

    /// Device-to-device copy of `bytes` on the compute stream.
    pub fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> CudaResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller passes two ranges inside live allocations of this device.
        unsafe { self.dev.copy_dtod(Stream::Compute, dst, src, bytes) }
    }
}

/// The `extern "C" __global__ void NAME(` entry points of a source, plus `HSX_ATTN(NAME, ..)`
/// instantiations; macro definitions (lines starting with `#` or continued with `\\`) are
/// templates, not entry points.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(super) fn kernel_names(src: &str) -> Vec<String> {
    const DECL: &str = "__global__ void ";
    let makers = kernel_macros(src);
    let mut names = Vec::new();
    for line in src.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.ends_with('\\') {
            continue;
        }
        let macro_args = (makers.iter())
            .find_map(|m| t.strip_prefix(m.as_str()).and_then(|r| r.strip_prefix('(')));
        let name = if let Some(args) = macro_args {
            args.split(',').next().unwrap_or("")
        } else if let Some(i) = t.find(DECL) {
            let rest = &t[i + DECL.len()..];
            &rest[..rest.find('(').unwrap_or(0)]
        } else {
            continue;
        };
        let name = name.trim();
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.push(name.to_string());
        }
    }
    names
}

/// The macros of `src` that define kernels (`#define NAME(...)` blocks whose body declares a
/// `__global__`, as `HSX_ATTN`): a line invoking one makes the kernel named by its first
/// argument.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn kernel_macros(src: &str) -> Vec<String> {
    let mut makers = Vec::new();
    let mut lines = src.lines();
    while let Some(line) = lines.next() {
        let Some(def) = line.trim().strip_prefix("#define ") else {
            continue;
        };
        let Some(name) = def.split('(').next().filter(|n| n.len() < def.len()) else {
            continue;
        };
        let mut body = line.to_string();
        let mut cont = line.trim_end().ends_with('\\');
        while cont {
            let Some(next) = lines.next() else { break };
            body.push_str(next);
            cont = next.trim_end().ends_with('\\');
        }
        if body.contains("__global__") {
            makers.push(name.trim().to_string());
        }
    }
    makers
}

/// A device buffer of `len` elements of `T` with bounds-checked raw pointers; freed on drop
/// (after the compute stream's work so far).
pub struct DevBuf<T> {
    dev: Arc<dyn DeviceApi>,
    ptr: DevPtr,
    /// Allocated bytes (at least one element, even when `len` is 0).
    bytes: usize,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> Drop for DevBuf<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by `Gpu::zeros` with `bytes`, freed once.
        unsafe { self.dev.free(self.ptr, self.bytes) };
    }
}

impl<T> DevBuf<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of element 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address of element `offset`, checking that `offset + count <= len`.
    pub fn ptr_at(&self, offset: usize, count: usize) -> CudaResult<u64> {
        match offset.checked_add(count) {
            Some(end) if end <= self.len => {
                Ok(self.ptr + (offset * std::mem::size_of::<T>()) as u64)
            }
            _ => Err(CudaError::Invalid(format!(
                "device range {offset}..{offset}+{count} outside a buffer of {}",
                self.len
            ))),
        }
    }

    /// Fails unless the buffer holds at least `count` elements.
    pub fn check(&self, count: usize, what: &str) -> CudaResult<()> {
        if count > self.len {
            return Err(CudaError::Invalid(format!(
                "{what}: {count} elements needed, buffer holds {}",
                self.len
            )));
        }
        Ok(())
    }
}

/// One block per row, `threads` threads.
pub fn rows_cfg(rows: usize, threads: u32) -> CudaResult<LaunchConfig> {
    let rows = u32::try_from(rows)
        .map_err(|_| CudaError::Invalid(format!("{rows} rows exceed a launch grid")))?;
    Ok(LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Blocks of 256 threads over a `[rows, cols]` array: grid (rows, ceil(cols / per_block)), so
/// that a kernel takes its row from blockIdx.x and its columns from blockIdx.y instead of
/// dividing a flat 64-bit index per element.
pub fn row_tiles_cfg(rows: usize, cols: usize, per_block: usize) -> CudaResult<LaunchConfig> {
    let mut cfg = rows_cfg(rows, 256)?;
    cfg.grid_dim.1 = u32::try_from(cols.div_ceil(per_block))
        .ok()
        .filter(|y| (1..=65_535).contains(y))
        .ok_or_else(|| CudaError::Invalid(format!("{cols} columns do not fit a launch grid")))?;
    Ok(cfg)
}

/// One thread per element, 256 per block.
pub fn elems_cfg(total: usize) -> CudaResult<LaunchConfig> {
    rows_cfg(total.div_ceil(256), 256)
}

#[cfg(all(test, feature = "cuda"))]
pub(crate) fn kernel_names_for_test(src: &str) -> Vec<String> {
    kernel_names(src)
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;
    use cudarc::driver::DriverError;
    use cudarc::driver::sys::CUresult;

    /// The kernels the driver loads by name (each source's [`kernel_names`]) are every entry
    /// point the C preprocessor finds (build.rs's `KERNEL_SIGS`), macro-made ones included
    /// (`HSX_ATTN`, `HSX_GDN_NORM`, `HSX_GATHER_SCALED`, …): a kernel missed here would be
    /// launched on a GPU and not found.
    #[test]
    fn every_entry_point_is_loaded_by_name() {
        let mut loaded: Vec<String> = (super::super::nvrtc::SOURCES.iter())
            .flat_map(|(_, src)| kernel_names(src))
            .collect();
        let mut declared: Vec<String> = (super::super::launch_args::KERNEL_SIGS.iter())
            .map(|(name, _)| name.to_string())
            .collect();
        loaded.sort();
        declared.sort();
        assert_eq!(loaded, declared);
        for name in [
            "moe_gather_scaled_bf16",
            "gdn_sigmoid_norm_f32",
            "attention_wide_f32_f32",
        ] {
            assert!(loaded.iter().any(|n| n == name), "{name}");
        }
    }

    #[test]
    fn row_tiles_cover_every_column_or_say_why_not() {
        let g = row_tiles_cfg(3, 1000, 256).unwrap();
        assert_eq!((g.grid_dim, g.block_dim), ((3, 4, 1), (256, 1, 1)));
        assert_eq!(row_tiles_cfg(2, 1024, 1024).unwrap().grid_dim, (2, 1, 1));
        assert!(row_tiles_cfg(1, 0, 256).is_err());
        assert!(row_tiles_cfg(1, 65_536 * 256, 256).is_err());
        assert!(row_tiles_cfg(1 << 32, 8, 256).is_err());
    }

    /// Sticky results mark the device lost; others fail only their step. (Formatting a
    /// DriverError needs libcuda, so only the classification is checked here.)
    #[test]
    fn sticky_cuda_errors_mark_the_device_lost() {
        let err = |r| CudaError::Driver(DriverError(r));
        for r in [
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
            CUresult::CUDA_ERROR_ASSERT,
        ] {
            assert!(err(r).is_sticky(), "{r:?}");
        }
        for r in [
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        ] {
            assert!(!err(r).is_sticky(), "{r:?}");
        }
        assert!(CudaError::Lost("x".into()).is_sticky());
        assert!(!CudaError::Invalid("x".into()).is_sticky());
    }
}

/// Device 0 for a kernel test, or `None` after printing why there is none (the test then
/// returns: skipped, saying so).
#[cfg(test)]
pub(crate) fn test_gpu() -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

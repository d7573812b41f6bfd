//! The device context under [`super::CudaDevice`]: context, streams, cuBLAS, kernels by name,
//! typed device buffers and the launch helper.
//!
//! # Streams and ordering
//! All compute is issued on [`Gpu::stream`], so kernels, GEMMs and copies on it run in issue
//! order and need no synchronisation between them. [`Gpu::copy_stream`] only downloads
//! captured rows; it is ordered after the compute that produced them by an event (see
//! [`super::capture`]). cudarc's automatic per-buffer event tracking is disabled (it would make
//! the compute stream wait for every download of a staging buffer): whoever adds a stream
//! orders it explicitly with [`Gpu::event_after_compute`] / `CudaStream::wait`.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    DriverError, ValidAsZeroBits,
};
use thiserror::Error;

use super::api::{CudaUnavailable, DeviceInfo};
use super::nvrtc;
use crate::kernels::{BackendError, DeviceError};

/// A failure of the CUDA runtime stack.
#[derive(Debug, Error)]
pub enum CudaError {
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error("cuBLAS: {0}")]
    Blas(#[from] cudarc::cublas::result::CublasError),
    #[error("{0}")]
    Compile(String),
    #[error("kernel `{0}` is not in any loaded module")]
    NoKernel(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Unavailable(#[from] CudaUnavailable),
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        BackendError::Compute(format!("cuda: {e}"))
    }
}

impl From<CudaError> for DeviceError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Invalid(m) => DeviceError::Invalid(m),
            other => DeviceError::Failed(format!("cuda: {other}")),
        }
    }
}

pub type CudaResult<T> = Result<T, CudaError>;

/// Checks the libraries and the device without touching anything that could panic.
pub fn probe(ordinal: usize) -> Result<DeviceInfo, CudaUnavailable> {
    // SAFETY (the three checks): they only try to dlopen the libraries.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoDriver);
    }
    if !nvrtc::nvrtc_present() {
        return Err(CudaUnavailable::NoNvrtc);
    }
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoCublas);
    }
    let count = CudaContext::device_count().map_err(|e| CudaUnavailable::Init(e.to_string()))?;
    let count = usize::try_from(count).unwrap_or(0);
    if count == 0 {
        return Err(CudaUnavailable::NoDevice);
    }
    if ordinal >= count {
        return Err(CudaUnavailable::BadOrdinal { ordinal, count });
    }
    let dev = |e: DriverError| CudaUnavailable::Device {
        ordinal,
        message: e.to_string(),
    };
    let ctx = CudaContext::new(ordinal).map_err(dev)?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name().map_err(dev)?,
        compute_capability: ctx.compute_capability().map_err(dev)?,
        total_memory: ctx.total_mem().map_err(dev)?,
        device_count: count,
    })
}

/// One device: context, compute and copy streams, cuBLAS handle, every kernel by name.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    /// Where all compute runs, in issue order.
    pub stream: Arc<CudaStream>,
    /// Device-to-host downloads of captured rows only.
    pub copy_stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub info: DeviceInfo,
    kernels: HashMap<String, CudaFunction>,
}

impl Gpu {
    /// Probes the device, creates the context and streams, compiles (once per process) and
    /// loads every module of [`nvrtc::SOURCES`].
    pub fn new(ordinal: usize) -> CudaResult<Self> {
        let info = probe(ordinal)?;
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: called before any buffer exists on this context; ordering across streams is
        // explicit from here on (module docs).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let copy_stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        let mut kernels = HashMap::new();
        for &(name, src) in nvrtc::SOURCES {
            let image =
                nvrtc::image(name, src, info.compute_capability).map_err(CudaError::Compile)?;
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image))?;
            for f in kernel_names(src) {
                let func = module.load_function(&f)?;
                kernels.insert(f, func);
            }
        }
        Ok(Self {
            ctx,
            stream,
            copy_stream,
            blas,
            info,
            kernels,
        })
    }

    /// A kernel function by its `extern "C"` name.
    pub fn func(&self, name: &str) -> CudaResult<&CudaFunction> {
        self.kernels
            .get(name)
            .ok_or_else(|| CudaError::NoKernel(name.to_string()))
    }

    /// A device attribute (e.g. the SM count).
    pub fn attribute(&self, attr: CUdevice_attribute) -> CudaResult<i32> {
        Ok(self.ctx.attribute(attr)?)
    }

    /// An event recorded after everything issued so far on the compute stream.
    pub fn event_after_compute(&self) -> CudaResult<CudaEvent> {
        Ok(self.stream.record_event(None)?)
    }

    /// Allocates `len` zeroed elements on the compute stream.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> CudaResult<DevBuf<T>> {
        // cuMemAlloc of 0 bytes fails; an empty buffer is still a valid (unused) one.
        let slice = self.stream.alloc_zeros::<T>(len.max(1))?;
        Ok(DevBuf::new(slice, &self.stream, len))
    }

    /// Copies `host` into a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> CudaResult<DevBuf<T>> {
        if host.is_empty() {
            // SAFETY: a 1-element allocation that is never read (len 0).
            let slice = unsafe { self.stream.alloc::<T>(1) }?;
            return Ok(DevBuf::new(slice, &self.stream, 0));
        }
        let slice = self.stream.clone_htod(host)?;
        Ok(DevBuf::new(slice, &self.stream, host.len()))
    }

    /// Copies `host` into the start of `dst` (on the compute stream; `host` must stay alive
    /// until the stream reaches the copy: cudarc copies pageable memory synchronously).
    pub fn write<T: DeviceRepr>(&self, dst: &mut DevBuf<T>, host: &[T]) -> CudaResult<()> {
        if host.len() > dst.len {
            return Err(CudaError::Invalid(format!(
                "upload of {} elements into a buffer of {}",
                host.len(),
                dst.len
            )));
        }
        if host.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice.slice_mut(..host.len());
        self.stream.memcpy_htod(host, &mut view)?;
        Ok(())
    }

    /// Copies the first `len` elements of `src` to the host, waiting for the compute stream.
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        src: &DevBuf<T>,
        len: usize,
    ) -> CudaResult<Vec<T>> {
        let mut out = vec![T::default(); len];
        self.download_into(src, &mut out)?;
        Ok(out)
    }

    /// Fills `dst` with the first `dst.len()` elements of `src`, waiting for the compute
    /// stream.
    pub fn download_into<T: DeviceRepr>(&self, src: &DevBuf<T>, dst: &mut [T]) -> CudaResult<()> {
        let len = dst.len();
        if len > src.len {
            return Err(CudaError::Invalid(format!(
                "download of {len} elements from a buffer of {}",
                src.len
            )));
        }
        if len > 0 {
            self.stream.memcpy_dtoh(&src.slice.slice(..len), dst)?;
        }
        self.stream.synchronize()?;
        Ok(())
    }

    /// Zeroes `bytes` bytes from device address `ptr` on the compute stream.
    pub fn memset_zero(&self, ptr: u64, bytes: usize) -> CudaResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller passes a range inside one live allocation of this context.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream())? };
        Ok(())
    }
}

/// The `extern "C" __global__ void NAME(` entry points of a source, plus `HSX_ATTN(NAME, ..)`
/// instantiations; macro definitions (lines starting with `#` or continued with `\\`) are
/// templates, not entry points.
fn kernel_names(src: &str) -> Vec<String> {
    const DECL: &str = "__global__ void ";
    let mut names = Vec::new();
    for line in src.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.ends_with('\\') {
            continue;
        }
        let name = if let Some(args) = t.strip_prefix("HSX_ATTN(") {
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

/// A device buffer of `len` elements of `T` with bounds-checked raw pointers.
pub struct DevBuf<T> {
    slice: CudaSlice<T>,
    ptr: u64,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> DevBuf<T> {
    fn new(slice: CudaSlice<T>, stream: &CudaStream, len: usize) -> Self {
        // With event tracking off, `device_ptr` only returns the address.
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(stream);
            ptr
        };
        Self {
            slice,
            ptr,
            len,
            _t: PhantomData,
        }
    }

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

    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

/// Launches kernel `$name` of `$gpu` on its compute stream with config `$cfg`; every argument
/// must be a `DeviceRepr` value (device pointers as `u64`, sizes as `i32` / `i64`, ...).
/// Evaluates to `CudaResult<()>`.
macro_rules! launch {
    ($gpu:expr, $name:expr, $cfg:expr $(, $arg:expr)* $(,)?) => {{
        use cudarc::driver::PushKernelArg as _;
        let gpu: &$crate::kernels::cuda::context::Gpu = $gpu;
        (|| -> $crate::kernels::cuda::context::CudaResult<()> {
            let func = gpu.func($name)?;
            let mut builder = gpu.stream.launch_builder(func);
            $( let arg = $arg; builder.arg(&arg); )*
            // SAFETY: the caller passes the kernel's exact parameter list (checked by review
            // against the .cu signature) and pointers into live buffers of the sizes the kernel
            // reads, checked with `DevBuf::ptr_at` / `check`.
            unsafe { builder.launch($cfg) }?;
            Ok(())
        })()
    }};
}
pub(crate) use launch;

/// One block per row, `threads` threads.
pub fn rows_cfg(rows: usize, threads: u32) -> CudaResult<cudarc::driver::LaunchConfig> {
    let rows = u32::try_from(rows)
        .map_err(|_| CudaError::Invalid(format!("{rows} rows exceed a launch grid")))?;
    Ok(cudarc::driver::LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One thread per element, 256 per block.
pub fn elems_cfg(total: usize) -> CudaResult<cudarc::driver::LaunchConfig> {
    rows_cfg(total.div_ceil(256), 256)
}

#[cfg(test)]
pub(crate) fn kernel_names_for_test(src: &str) -> Vec<String> {
    kernel_names(src)
}

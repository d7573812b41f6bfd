//! [`DeviceApi`] on a real GPU through cudarc (feature `cuda`, dynamic loading): the primary
//! context, a compute and a copy stream, the cuBLAS handle bound to the compute stream, and
//! every kernel of [`nvrtc::SOURCES`] compiled for the device and loaded by name.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::result as cu;
use cudarc::driver::sys::{CUDA_MEMCPY2D, CUmemorytype};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError};

use super::api::{CudaUnavailable, CudaVersions, DeviceInfo};
use super::context::{CudaError, CudaResult, kernel_names};
use super::driver::{DevPtr, DeviceApi, Event, GemmEx, LaunchConfig, Op, Stream};
use super::nvrtc;
use crate::kernels::dtype::WeightDtype;

/// The versions of the driver, NVRTC and cuBLAS present (each only after its library is
/// found, so nothing here can panic on a missing one).
pub fn versions() -> CudaVersions {
    use std::ffi::c_int;
    let mut v = CudaVersions::default();
    // SAFETY (each block): the library was just found; the calls only write the ints given.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        let mut n: c_int = 0;
        let ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut n) };
        if ok == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            v.driver = Some((n / 1000, (n % 1000) / 10));
        }
    }
    if nvrtc::nvrtc_present() {
        let (mut a, mut b): (c_int, c_int) = (0, 0);
        let ok = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
        if ok == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            v.nvrtc = Some((a, b));
        }
    }
    if unsafe { cudarc::cublas::sys::is_culib_present() } {
        use cudarc::cublas::sys::{cublasGetProperty, cublasStatus_t, libraryPropertyType};
        let (mut a, mut b): (c_int, c_int) = (0, 0);
        let ok = unsafe {
            (
                cublasGetProperty(libraryPropertyType::MAJOR_VERSION, &mut a),
                cublasGetProperty(libraryPropertyType::MINOR_VERSION, &mut b),
            )
        };
        if ok
            == (
                cublasStatus_t::CUBLAS_STATUS_SUCCESS,
                cublasStatus_t::CUBLAS_STATUS_SUCCESS,
            )
        {
            v.cublas = Some((a, b));
        }
    }
    v
}

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
    versions().check()?;
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
    let compute_capability = ctx.compute_capability().map_err(dev)?;
    probe_kernel(&ctx, compute_capability)?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name().map_err(dev)?,
        compute_capability,
        total_memory: ctx.total_mem().map_err(dev)?,
        device_count: count,
    })
}

/// Compiles [`nvrtc::PROBE_SOURCE`] for the device (once per process, as every module: the
/// probe runs again when the device opens) and loads it, so that an NVRTC or driver that
/// cannot serve this GPU is named at start (with the versions found), before any model.
fn probe_kernel(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<(), CudaUnavailable> {
    let fail = |stage, message: String| CudaUnavailable::ProbeKernel {
        stage,
        sm: format!("{}{}", cc.0, cc.1),
        versions: versions().describe(),
        message,
    };
    let image = nvrtc::image("probe", nvrtc::PROBE_SOURCE, cc).map_err(|e| fail("compiled", e))?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_binary(image))
        .map_err(|e| fail("loaded", e.to_string()))?;
    module
        .load_function("hsx_probe")
        .map_err(|e| fail("loaded", e.to_string()))?;
    Ok(())
}

/// One GPU through cudarc.
pub struct CudarcDevice {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    blas: CudaBlas,
    info: DeviceInfo,
    kernels: HashMap<String, CudaFunction>,
}

impl CudarcDevice {
    /// Probes the device, creates the context and streams, compiles (once per process) and
    /// loads every module of [`nvrtc::SOURCES`].
    pub fn new(ordinal: usize) -> CudaResult<Self> {
        let info = probe(ordinal)?;
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: called before any buffer exists on this context; ordering across streams is
        // explicit (events).
        unsafe { ctx.disable_event_tracking() };
        let compute = ctx.new_stream()?;
        let copy = ctx.new_stream()?;
        let blas = CudaBlas::new(compute.clone())?;
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
            compute,
            copy,
            blas,
            info,
            kernels,
        })
    }

    fn stream(&self, s: Stream) -> &Arc<CudaStream> {
        match s {
            Stream::Compute => &self.compute,
            Stream::Copy => &self.copy,
        }
    }

    fn cu(&self, s: Stream) -> CudaResult<cudarc::driver::sys::CUstream> {
        self.ctx.bind_to_thread()?;
        Ok(self.stream(s).cu_stream())
    }
}

fn cuda_event(e: &Event) -> CudaResult<&CudaEvent> {
    e.0.downcast_ref::<CudaEvent>()
        .ok_or_else(|| CudaError::Invalid("an event of another device".into()))
}

fn data_type(d: WeightDtype) -> cudaDataType {
    match d {
        WeightDtype::F32 => cudaDataType::CUDA_R_32F,
        WeightDtype::Bf16 => cudaDataType::CUDA_R_16BF,
        WeightDtype::F16 => cudaDataType::CUDA_R_16F,
    }
}

fn op(o: Op) -> cublasOperation_t {
    match o {
        Op::N => cublasOperation_t::CUBLAS_OP_N,
        Op::T => cublasOperation_t::CUBLAS_OP_T,
    }
}

impl DeviceApi for CudarcDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc_zeroed(&self, bytes: usize) -> CudaResult<DevPtr> {
        let s = self.cu(Stream::Compute)?;
        // SAFETY: a stream-ordered allocation on this context's compute stream, zeroed there.
        unsafe {
            let p = cu::malloc_async(s, bytes)?;
            cu::memset_d8_async(p, 0, bytes, s)?;
            Ok(p)
        }
    }

    unsafe fn free(&self, ptr: DevPtr, _bytes: usize) {
        if let Ok(s) = self.cu(Stream::Compute) {
            // SAFETY: caller's contract; freed after the compute stream's work so far.
            let _ = unsafe { cu::free_async(ptr, s) };
        }
    }

    unsafe fn copy_htod(&self, s: Stream, dst: DevPtr, src: &[u8]) -> CudaResult<()> {
        // SAFETY: caller's contract; from pageable memory the call returns once `src` is staged.
        unsafe { cu::memcpy_htod_async(dst, src, self.cu(s)?)? };
        Ok(())
    }

    unsafe fn copy_dtoh(&self, s: Stream, src: DevPtr, dst: &mut [u8]) -> CudaResult<()> {
        // SAFETY: caller's contract; synchronised before `dst` is handed back.
        unsafe { cu::memcpy_dtoh_async(dst, src, self.cu(s)?)? };
        self.synchronize(s)
    }

    unsafe fn copy_dtod(
        &self,
        s: Stream,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> CudaResult<()> {
        // SAFETY: caller's contract.
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, self.cu(s)?)? };
        Ok(())
    }

    unsafe fn memset_zero(&self, s: Stream, ptr: DevPtr, bytes: usize) -> CudaResult<()> {
        // SAFETY: caller's contract.
        unsafe { cu::memset_d8_async(ptr, 0, bytes, self.cu(s)?)? };
        Ok(())
    }

    unsafe fn copy_dtoh_2d(
        &self,
        s: Stream,
        dst: *mut u8,
        dst_pitch: usize,
        src: DevPtr,
        src_pitch: usize,
        width: usize,
        height: usize,
    ) -> CudaResult<()> {
        let copy = CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: src_pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
            dstHost: dst as *mut c_void,
            dstDevice: 0,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch,
            WidthInBytes: width,
            Height: height,
        };
        let stream = self.cu(s)?;
        // SAFETY: caller's contract.
        unsafe { cudarc::driver::sys::cuMemcpy2DAsync_v2(&copy, stream).result()? };
        Ok(())
    }

    fn alloc_pinned(&self, bytes: usize) -> CudaResult<*mut u8> {
        self.ctx.bind_to_thread()?;
        // SAFETY: plain cuMemHostAlloc; flags 0 = cached, page-locked.
        let ptr = unsafe { cu::malloc_host(bytes, 0) }? as *mut u8;
        if ptr.is_null() {
            return Err(CudaError::Invalid("cuMemHostAlloc returned null".into()));
        }
        Ok(ptr)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: caller's contract.
        let _ = unsafe { cu::free_host(ptr as *mut c_void) };
    }

    unsafe fn launch(
        &self,
        name: &str,
        cfg: LaunchConfig,
        s: Stream,
        params: &mut [*mut c_void],
        _sizes: &[u32],
    ) -> CudaResult<()> {
        let f = self
            .kernels
            .get(name)
            .ok_or_else(|| CudaError::NoKernel(name.to_string()))?;
        let stream = self.cu(s)?;
        // SAFETY: caller's contract (the kernel's parameters, live device memory).
        unsafe {
            cu::launch_kernel(
                f.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                stream,
                params,
            )?
        };
        Ok(())
    }

    fn new_event(&self) -> CudaResult<Event> {
        Ok(Event(Box::new(self.ctx.new_event(None)?)))
    }

    fn record(&self, event: &Event, s: Stream) -> CudaResult<()> {
        Ok(cuda_event(event)?.record(self.stream(s))?)
    }

    fn wait(&self, s: Stream, event: &Event) -> CudaResult<()> {
        Ok(self.stream(s).wait(cuda_event(event)?)?)
    }

    fn synchronize(&self, s: Stream) -> CudaResult<()> {
        Ok(self.stream(s).synchronize()?)
    }

    unsafe fn gemm_ex(&self, s: Stream, g: &GemmEx) -> CudaResult<()> {
        if s != Stream::Compute {
            return Err(CudaError::Invalid(
                "cuBLAS is bound to the compute stream".into(),
            ));
        }
        self.ctx.bind_to_thread()?;
        let dt = data_type(g.ab_type);
        // SAFETY: caller's contract; the handle is bound to the compute stream.
        unsafe {
            gemm_ex(
                *self.blas.handle(),
                op(g.transa),
                op(g.transb),
                g.m,
                g.n,
                g.k,
                &g.alpha as *const f32 as *const c_void,
                g.a as *const c_void,
                dt,
                g.lda,
                g.b as *const c_void,
                dt,
                g.ldb,
                &g.beta as *const f32 as *const c_void,
                g.c as *mut c_void,
                cudaDataType::CUDA_R_32F,
                g.ldc,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }
}

impl Drop for CudarcDevice {
    fn drop(&mut self) {
        // Nothing issued may still run or copy when the context goes.
        let _ = self.compute.synchronize();
        let _ = self.copy.synchronize();
    }
}

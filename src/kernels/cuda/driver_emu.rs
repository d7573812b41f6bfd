//! [`DeviceApi`] on the host (feature `cuda-emu`): device memory is host memory, every stream
//! runs its work at once in issue order (so events are trivially satisfied), kernels are the
//! project's own `.cu` sources compiled for the CPU by build.rs (`emu/cuda_emu.h`), and
//! `gemm_ex` follows cuBLAS's documented column-major definition, written from it (not from
//! hsx's wrapper in `gemm.rs`) so that a wrong transpose or leading dimension shows.
//!
//! What it cannot show: timing, real memory ordering between streams (a missing event would
//! go unnoticed), cuBLAS's own kernels, libdevice's `expf` (glibc's is used).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, OnceLock};

use super::api::DeviceInfo;
use super::context::{CudaError, CudaResult};
use super::driver::{DevPtr, DeviceApi, Event, GemmEx, LaunchConfig, Op, Stream};
use crate::kernels::dtype::WeightDtype;

/// cuLaunchKernel's configuration as the C++ trampolines take it (`hsx_emu::Launch`).
#[repr(C)]
pub struct EmuLaunch {
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
}

type EmuKernel = unsafe extern "C" fn(*const EmuLaunch, *mut *mut c_void, i32, *const u32) -> i32;

mod table {
    use super::{EmuKernel, EmuLaunch};
    use std::ffi::c_void;
    include!(concat!(env!("OUT_DIR"), "/emu_kernels.rs"));
}

unsafe extern "C" {
    fn hsx_emu_last_error(buf: *mut c_char, cap: usize) -> usize;
}

/// Device allocations are aligned like cudaMalloc's.
const DEVICE_ALIGN: usize = 256;
const PINNED_ALIGN: usize = 4096;

/// Emulated devices (two, so a test can use device 1 alone: see [`fault_next_launch`]).
const DEVICES: usize = 2;

/// The emulated device.
pub struct EmuDevice {
    info: DeviceInfo,
    kernels: HashMap<&'static str, EmuKernel>,
    /// Set by a fault inside a kernel: from then on every call fails with it, as a CUDA
    /// context does after a sticky error.
    lost: OnceLock<String>,
}

impl EmuDevice {
    pub fn new(ordinal: usize) -> CudaResult<Self> {
        Ok(Self {
            info: info(ordinal)?,
            kernels: table::KERNELS.iter().copied().collect(),
            lost: OnceLock::new(),
        })
    }

    /// The sticky error, once there is one.
    fn alive(&self) -> CudaResult<()> {
        match self.lost.get() {
            Some(why) => Err(CudaError::Lost(why.clone())),
            None => Ok(()),
        }
    }

    /// Makes the device unusable, as a fault in a kernel does on a GPU.
    fn lose(&self, why: String) -> CudaError {
        CudaError::Lost(self.lost.get_or_init(|| why).clone())
    }
}

/// Kernel launches to fail as if the kernel had faulted: (ordinal, kernel name).
static FAULTS: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());

/// Test hook: the next launch of `kernel` on emulated device `ordinal` faults like an illegal
/// memory access on a GPU (a sticky error: the device is unusable afterwards). Only the
/// engine's error handling is under test, so the kernel does not run.
pub fn fault_next_launch(ordinal: usize, kernel: &str) {
    let mut f = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    f.push((ordinal, kernel.to_string()));
}

/// Takes the fault planted for this launch, if any.
fn planted_fault(ordinal: usize, kernel: &str) -> bool {
    let mut f = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let hit = f.iter().position(|(o, k)| *o == ordinal && k == kernel);
    hit.map(|i| f.remove(i)).is_some()
}

/// What the probe reports: [`DEVICES`] identical devices.
pub fn info(ordinal: usize) -> Result<DeviceInfo, super::api::CudaUnavailable> {
    if ordinal >= DEVICES {
        return Err(super::api::CudaUnavailable::BadOrdinal {
            ordinal,
            count: DEVICES,
        });
    }
    Ok(DeviceInfo {
        ordinal,
        name: "hsx CUDA emulator (host)".into(),
        compute_capability: (9, 0),
        total_memory: 16 << 30,
        device_count: DEVICES,
    })
}

fn layout(bytes: usize, align: usize) -> CudaResult<Layout> {
    Layout::from_size_align(bytes.max(1), align)
        .map_err(|_| CudaError::Invalid(format!("an allocation of {bytes} bytes")))
}

/// The message of the last failed launch on this thread.
pub(super) fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: the C side writes at most `cap` bytes, NUL-terminated.
    let n = unsafe { hsx_emu_last_error(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    buf.truncate(n.min(buf.len() - 1));
    String::from_utf8_lossy(&buf).into_owned()
}

impl DeviceApi for EmuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc_zeroed(&self, bytes: usize) -> CudaResult<DevPtr> {
        self.alive()?;
        // SAFETY: a non-zero size (`layout` rounds 0 up to 1).
        let p = unsafe { alloc_zeroed(layout(bytes, DEVICE_ALIGN)?) };
        if p.is_null() {
            return Err(CudaError::Invalid(format!("out of memory ({bytes} bytes)")));
        }
        Ok(p as DevPtr)
    }

    unsafe fn free(&self, ptr: DevPtr, bytes: usize) {
        if let Ok(l) = layout(bytes, DEVICE_ALIGN) {
            // SAFETY: allocated by `alloc_zeroed` with this layout (caller's contract).
            unsafe { dealloc(ptr as *mut u8, l) };
        }
    }

    unsafe fn copy_htod(&self, _: Stream, dst: DevPtr, src: &[u8]) -> CudaResult<()> {
        self.alive()?;
        // SAFETY: caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn copy_dtoh(&self, _: Stream, src: DevPtr, dst: &mut [u8]) -> CudaResult<()> {
        self.alive()?;
        // SAFETY: caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_dtod(
        &self,
        _: Stream,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> CudaResult<()> {
        self.alive()?;
        // SAFETY: caller's contract (cuMemcpy ranges may not overlap either).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn memset_zero(&self, _: Stream, ptr: DevPtr, bytes: usize) -> CudaResult<()> {
        self.alive()?;
        // SAFETY: caller's contract.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(())
    }

    unsafe fn copy_dtoh_2d(
        &self,
        _: Stream,
        dst: *mut u8,
        dst_pitch: usize,
        src: DevPtr,
        src_pitch: usize,
        width: usize,
        height: usize,
    ) -> CudaResult<()> {
        self.alive()?;
        if width > dst_pitch || width > src_pitch {
            return Err(CudaError::Invalid(format!(
                "2-D copy of {width}-byte rows with pitches {src_pitch} / {dst_pitch}"
            )));
        }
        for r in 0..height {
            // SAFETY: caller's contract: row r of both regions is inside its allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src as *const u8).add(r * src_pitch),
                    dst.add(r * dst_pitch),
                    width,
                )
            };
        }
        Ok(())
    }

    fn alloc_pinned(&self, bytes: usize) -> CudaResult<*mut u8> {
        self.alive()?;
        // SAFETY: non-zero size.
        let p = unsafe { alloc_zeroed(layout(bytes, PINNED_ALIGN)?) };
        if p.is_null() {
            return Err(CudaError::Invalid(format!(
                "out of pinned memory ({bytes} bytes)"
            )));
        }
        Ok(p)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) {
        if let Ok(l) = layout(bytes, PINNED_ALIGN) {
            // SAFETY: caller's contract.
            unsafe { dealloc(ptr, l) };
        }
    }

    unsafe fn launch(
        &self,
        name: &str,
        cfg: LaunchConfig,
        _: Stream,
        params: &mut [*mut c_void],
        sizes: &[u32],
    ) -> CudaResult<()> {
        self.alive()?;
        let f = self
            .kernels
            .get(name)
            .ok_or_else(|| CudaError::NoKernel(name.to_string()))?;
        let l = EmuLaunch {
            grid: [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2],
            block: [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2],
            shared_bytes: cfg.shared_mem_bytes,
        };
        let np = i32::try_from(params.len()).unwrap_or(i32::MAX);
        if sizes.len() != params.len() {
            return Err(CudaError::Invalid("launch: sizes and params differ".into()));
        }
        // SAFETY: the trampoline reads `np` parameters of the kernel's own types after checking
        // their count and sizes; the addresses in them are the caller's contract.
        if planted_fault(self.info.ordinal, name) {
            return Err(self.lose(format!(
                "kernel `{name}`: an illegal memory access was encountered (planted by a test)"
            )));
        }
        let rc = unsafe { f(&l, params.as_mut_ptr(), np, sizes.as_ptr()) };
        match rc {
            0 => Ok(()),
            // A fault while it ran: on a GPU the context is unusable from here on.
            2 => Err(self.lose(format!("kernel `{name}`: {}", last_error()))),
            _ => Err(CudaError::Launch {
                kernel: name.to_string(),
                message: last_error(),
            }),
        }
    }

    fn new_event(&self) -> CudaResult<Event> {
        self.alive()?;
        Ok(Event(Box::new(())))
    }

    fn record(&self, _: &Event, _: Stream) -> CudaResult<()> {
        self.alive()
    }

    fn wait(&self, _: Stream, _: &Event) -> CudaResult<()> {
        self.alive()
    }

    fn synchronize(&self, _: Stream) -> CudaResult<()> {
        self.alive()
    }

    unsafe fn gemm_ex(&self, _: Stream, g: &GemmEx) -> CudaResult<()> {
        self.alive()?;
        gemm_check(g)?;
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        if m == 0 || n == 0 {
            return Ok(());
        }
        // op(A) as m rows of k, op(B)ᵀ as n rows of k (f32), read through the stored layout.
        // SAFETY: `gemm_check` validated the leading dimensions; the extents are the caller's
        // contract.
        let a = unsafe { gather(g.a, g.ab_type, g.lda as usize, g.transa, m, k, false) };
        let b = unsafe { gather(g.b, g.ab_type, g.ldb as usize, g.transb, n, k, true) };
        let c = g.c as *mut f32;
        let ldc = g.ldc as usize;
        for j in 0..n {
            let bj = &b[j * k..(j + 1) * k];
            for i in 0..m {
                let ai = &a[i * k..(i + 1) * k];
                // CUBLAS_COMPUTE_32F: products and sums in f32.
                let dot = ai.iter().zip(bj).fold(0.0f32, |s, (x, y)| s + x * y);
                // SAFETY: C holds column j's m values at j·ldc (ldc ≥ m, checked).
                let cij = unsafe { &mut *c.add(i + j * ldc) };
                // beta = 0: C is not read (BLAS convention: NaN there must not propagate).
                *cij = match g.beta == 0.0 {
                    true => g.alpha * dot,
                    false => g.alpha * dot + g.beta * *cij,
                };
            }
        }
        Ok(())
    }
}

/// cuBLAS's argument checks (CUBLAS_STATUS_INVALID_VALUE).
fn gemm_check(g: &GemmEx) -> CudaResult<()> {
    let rows_a = if g.transa == Op::N { g.m } else { g.k };
    let rows_b = if g.transb == Op::N { g.k } else { g.n };
    let ok = g.m >= 0
        && g.n >= 0
        && g.k >= 0
        && g.lda >= rows_a.max(1)
        && g.ldb >= rows_b.max(1)
        && g.ldc >= g.m.max(1);
    if ok {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "cublasGemmEx: CUBLAS_STATUS_INVALID_VALUE ({g:?})"
        )))
    }
}

/// `rows × k` f32 values: element (r, p) of op(X) when `!as_cols` (X is A: op(A) is m × k),
/// element (p, r) of op(X) when `as_cols` (X is B: op(B) is k × n, returned transposed).
/// Column-major storage: X(i, j) is at `i + j·ld`; op = T reads X(j, i).
///
/// # Safety
/// `x` holds every element the shape and `ld` reach.
unsafe fn gather(
    x: DevPtr,
    dtype: WeightDtype,
    ld: usize,
    op: Op,
    rows: usize,
    k: usize,
    as_cols: bool,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * k);
    for r in 0..rows {
        for p in 0..k {
            // (i, j) of op(X): A → (r, p); B → (p, r).
            let (i, j) = if as_cols { (p, r) } else { (r, p) };
            // op(X)(i, j) = X(i, j) for N, X(j, i) for T.
            let (si, sj) = if op == Op::N { (i, j) } else { (j, i) };
            // SAFETY: caller's contract.
            out.push(unsafe { element(x, dtype, si + sj * ld) });
        }
    }
    out
}

/// Element `idx` of a device array of `dtype`, as f32.
///
/// # Safety
/// `x` holds more than `idx` elements.
unsafe fn element(x: DevPtr, dtype: WeightDtype, idx: usize) -> f32 {
    // SAFETY: caller's contract.
    unsafe {
        match dtype {
            WeightDtype::F32 => *(x as *const f32).add(idx),
            WeightDtype::Bf16 => half::bf16::from_bits(*(x as *const u16).add(idx)).to_f32(),
            WeightDtype::F16 => half::f16::from_bits(*(x as *const u16).add(idx)).to_f32(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::test_gpu;
    use super::super::ops;
    use crate::kernels::dtype::WeightDtype;
    use std::ffi::c_void;

    unsafe extern "C" {
        fn hsx_emu_lane_stacks(out: *mut *const c_void, cap: usize, bytes: *mut usize) -> usize;
    }

    /// The lane stacks of the calling thread and the usable bytes of each.
    fn lane_stacks() -> (Vec<usize>, usize) {
        let mut bytes = 0;
        // SAFETY: a null buffer of capacity 0 is never written; `bytes` is a valid place.
        let n = unsafe { hsx_emu_lane_stacks(std::ptr::null_mut(), 0, &mut bytes) };
        let mut out = vec![std::ptr::null(); n];
        // SAFETY: `out` holds `n` pointers.
        unsafe { hsx_emu_lane_stacks(out.as_mut_ptr(), n, &mut bytes) };
        (out.into_iter().map(|p| p as usize).collect(), bytes)
    }

    /// Memory mapped where an exited thread's lanes had their stacks reads clean: under
    /// `HSX_EMU_ASAN=1` libasan checks the copy out of it, and the lanes' frames once left it
    /// poisoned (CI's ASAN step failed so, copying a checkpoint's weights that the kernel had
    /// mapped where an earlier test's lanes ran). The stacks must be unmapped by then: at
    /// least one address is free again (the others may have been taken by other maps since).
    #[test]
    fn memory_mapped_over_exited_lane_stacks_reads_clean() {
        // Allocated before the thread runs, so that this allocation cannot take a lane stack's
        // address once it is free; 4 MiB is more than a lane stack under either build.
        let mut copy = vec![1u8; 4 << 20];
        let Some((stacks, bytes)) = std::thread::spawn(|| {
            let gpu = test_gpu()?;
            let x = gpu.upload(&[1f32; 4096]).unwrap();
            ops::scale(&gpu, x.ptr(), WeightDtype::F32, 2.0, 4096).unwrap();
            assert_eq!(gpu.download(&x, 4096).unwrap(), vec![2f32; 4096]);
            Some(lane_stacks())
        })
        .join()
        .unwrap() else {
            return;
        };
        assert!(!stacks.is_empty() && bytes <= copy.len());
        let mut remapped = 0;
        for addr in stacks {
            // SAFETY: a fresh private anonymous map; NOREPLACE refuses any address in use.
            let m = unsafe {
                libc::mmap(
                    addr as *mut c_void,
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if m != addr as *mut c_void {
                eprintln!("{addr:#x} taken: {}", std::io::Error::last_os_error());
                if m != libc::MAP_FAILED {
                    // SAFETY: the map just made (an old kernel that took the address as a hint).
                    unsafe { libc::munmap(m, bytes) };
                }
                continue;
            }
            // SAFETY: `m` maps `bytes` readable bytes; `copy` holds as many.
            unsafe {
                std::ptr::copy_nonoverlapping(m as *const u8, copy.as_mut_ptr(), bytes);
                libc::munmap(m, bytes);
            }
            assert!(copy[..bytes].iter().all(|&b| b == 0));
            remapped += 1;
        }
        assert!(
            remapped > 0,
            "no lane stack address is free once its thread exited"
        );
    }
}

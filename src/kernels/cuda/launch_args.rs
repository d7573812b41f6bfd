//! Kernel launches with their arguments checked against the kernels' `extern "C"` signatures.
//!
//! build.rs reads every `__global__` entry point of the `.cu` sources (after the C
//! preprocessor) and writes [`KERNEL_SIGS`]: each kernel's parameter kinds. [`launch!`] checks
//! its arguments' Rust types against them **at compile time**: the kernel named by a string
//! literal, or, where the name is computed (`format!("rms_norm_{}", suffix)`), the literal
//! after `=>` (a kernel of the same family). A wrong count, order or type is then a build
//! error ("kernel arguments do not match"), not a corrupted launch. At run time
//! [`Gpu::launch`] also checks the computed name's own signature.

use std::ffi::c_void;

use super::context::{CudaError, CudaResult, Gpu, LaunchConfig};
use super::driver::Stream;
use super::kv_cache::AttnArgs;

/// The kind of one kernel parameter, as the Rust side passes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// Any pointer (a `CUdeviceptr`, `u64`).
    Ptr,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
    Attn,
}

include!(concat!(env!("OUT_DIR"), "/kernel_sigs.rs"));

/// One kernel argument by value (device pointers are `u64`).
#[derive(Clone, Copy)]
pub enum KernelArg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    U32(u32),
    F32(f32),
    F64(f64),
    Attn(AttnArgs),
}

impl KernelArg {
    fn kind(&self) -> ArgKind {
        match self {
            Self::Ptr(_) => ArgKind::Ptr,
            Self::I64(_) => ArgKind::I64,
            Self::I32(_) => ArgKind::I32,
            Self::U32(_) => ArgKind::U32,
            Self::F32(_) => ArgKind::F32,
            Self::F64(_) => ArgKind::F64,
            Self::Attn(_) => ArgKind::Attn,
        }
    }

    /// A pointer to the value (cuLaunchKernel's `kernelParams` entry) and its size.
    fn param(&mut self) -> (*mut c_void, u32) {
        fn p<T>(v: &mut T) -> (*mut c_void, u32) {
            (v as *mut T as *mut c_void, std::mem::size_of::<T>() as u32)
        }
        match self {
            Self::Ptr(v) => p(v),
            Self::I64(v) => p(v),
            Self::I32(v) => p(v),
            Self::U32(v) => p(v),
            Self::F32(v) => p(v),
            Self::F64(v) => p(v),
            Self::Attn(v) => p(v),
        }
    }
}

/// A Rust type a kernel parameter can be passed as.
pub trait KernelParam: Copy {
    const KIND: ArgKind;
    fn arg(self) -> KernelArg;
}

macro_rules! kernel_param {
    ($($t:ty => $v:ident),*) => {$(
        impl KernelParam for $t {
            const KIND: ArgKind = ArgKind::$v;
            fn arg(self) -> KernelArg {
                KernelArg::$v(self)
            }
        }
    )*};
}
kernel_param!(u64 => Ptr, i64 => I64, i32 => I32, u32 => U32, f32 => F32, f64 => F64,
    AttnArgs => Attn);

/// A tuple of kernel arguments.
pub trait KernelArgs {
    const KINDS: &'static [ArgKind];
    fn args(self) -> Vec<KernelArg>;
}

macro_rules! kernel_args {
    ($($t:ident),*) => {
        impl<$($t: KernelParam),*> KernelArgs for ($($t,)*) {
            const KINDS: &'static [ArgKind] = &[$($t::KIND),*];
            #[allow(non_snake_case)]
            fn args(self) -> Vec<KernelArg> {
                let ($($t,)*) = self;
                vec![$($t.arg()),*]
            }
        }
    };
}
kernel_args!(A);
kernel_args!(A, B);
kernel_args!(A, B, C);
kernel_args!(A, B, C, D);
kernel_args!(A, B, C, D, E);
kernel_args!(A, B, C, D, E, F);
kernel_args!(A, B, C, D, E, F, G);
kernel_args!(A, B, C, D, E, F, G, H);
kernel_args!(A, B, C, D, E, F, G, H, I);
kernel_args!(A, B, C, D, E, F, G, H, I, J);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, R);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, R, S);
kernel_args!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, R, S, U);

const fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The index of kernel `name` in [`KERNEL_SIGS`]; a compile error when evaluated in a const
/// for a name no source declares.
pub const fn sig_index(name: &str) -> usize {
    let mut i = 0;
    while i < KERNEL_SIGS.len() {
        if same_name(KERNEL_SIGS[i].0, name) {
            return i;
        }
        i += 1;
    }
    panic!("no kernel of that name in src/kernels/cuda/*.cu")
}

const fn same_kinds(a: &[ArgKind], b: &[ArgKind]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] as u8 != b[i] as u8 {
            return false;
        }
        i += 1;
    }
    true
}

/// Compiles only if `T`'s kinds are kernel `I`'s parameters; returns the arguments.
pub fn checked<const I: usize, T: KernelArgs>(args: T) -> Vec<KernelArg> {
    const {
        assert!(
            same_kinds(KERNEL_SIGS[I].1, T::KINDS),
            "kernel arguments do not match the kernel's extern \"C\" signature (count, order or type)"
        )
    };
    args.args()
}

/// The parameter kinds of kernel `name` (run time).
fn kinds_of(name: &str) -> Option<&'static [ArgKind]> {
    KERNEL_SIGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, k)| *k)
}

impl Gpu {
    /// Launches kernel `name` on the compute stream with `args` in the kernel's order (use
    /// [`launch!`], which checks them at compile time).
    pub fn launch(
        &self,
        name: &str,
        cfg: LaunchConfig,
        mut args: Vec<KernelArg>,
    ) -> CudaResult<()> {
        let kinds: Vec<ArgKind> = args.iter().map(KernelArg::kind).collect();
        match kinds_of(name) {
            Some(want) if want == kinds.as_slice() => {}
            Some(want) => {
                return Err(CudaError::Invalid(format!(
                    "kernel `{name}` takes {want:?}, the launch passes {kinds:?}"
                )));
            }
            None => return Err(CudaError::NoKernel(name.to_string())),
        }
        let (mut params, sizes): (Vec<*mut c_void>, Vec<u32>) =
            args.iter_mut().map(KernelArg::param).unzip();
        // SAFETY: `params` point into `args`, alive for the call, of the kernel's own kinds
        // (checked above); the callers pass pointers into live buffers of the sizes the kernel
        // reads, checked with `DevBuf::ptr_at` / `check`.
        unsafe {
            self.dev
                .launch(name, cfg, Stream::Compute, &mut params, &sizes)
        }?;
        if self.sync_each_launch {
            self.synchronize().map_err(|e| CudaError::Launch {
                kernel: name.to_string(),
                message: format!("failed (HSX_CUDA_SYNC=1): {e}"),
            })?;
        }
        Ok(())
    }
}

/// `launch!(gpu, "name", cfg, args...)`, or `launch!(gpu, &computed => "same_family", cfg,
/// args...)`: launches a kernel on the compute stream; the arguments' types are checked at
/// compile time against the literal kernel's `extern "C"` signature. Evaluates to
/// `CudaResult<()>`.
macro_rules! launch {
    ($gpu:expr, $name:literal, $cfg:expr $(, $arg:expr)* $(,)?) => {
        $crate::kernels::cuda::context::launch!($gpu, $name => $name, $cfg $(, $arg)*)
    };
    ($gpu:expr, $name:expr => $like:literal, $cfg:expr $(, $arg:expr)* $(,)?) => {{
        let gpu: &$crate::kernels::cuda::context::Gpu = $gpu;
        const I: usize = $crate::kernels::cuda::launch_args::sig_index($like);
        let args = $crate::kernels::cuda::launch_args::checked::<I, _>(($($arg,)*));
        gpu.launch($name, $cfg, args)
    }};
}
pub(crate) use launch;

//! The CUDA backend (cargo feature `cuda`): cudarc with dynamic loading, `.cu` kernels compiled
//! by NVRTC at start-up, cuBLAS for the GEMMs. Without the feature this module still compiles
//! and every entry point answers with a clear [`CudaUnavailable::NotBuilt`].
//!
//! # What the infra offers (for whoever adds a model or a kernel)
//! - [`context::Gpu`]: the device context, the compute stream (all compute runs on it, in
//!   order), a side copy stream (capture downloads), the cuBLAS handle and every kernel
//!   function by name ([`context::Gpu::func`]). cudarc's per-buffer event tracking is OFF:
//!   ordering across streams is explicit (events), see [`capture`].
//! - [`context::DevBuf`]: a typed device buffer with bounds-checked raw pointers
//!   ([`context::DevBuf::ptr_at`]); kernels take raw device pointers, so sub-ranges (the q / k
//!   / v columns of fused qkv rows, one layer of the cache) need no views.
//! - [`context::launch!`](crate::kernels::cuda::context): `launch!(gpu, "name", cfg, args...)`.
//! - [`gemm`]: `y[M, N] (f32) = x[M, K] · W[N, K]ᵀ` with W in f32 / bf16 / f16 and f32
//!   accumulation ([`gemm::linear`]); [`weights::DevWeight`] uploads a checkpoint tensor once.
//! - [`ops`]: RMSNorm (+ fused residual add), per-head RMSNorm, RoPE (full and partial rotary,
//!   host-precomputed inv_freq), SwiGLU, bias add, residual add, embedding gather, row gather,
//!   greedy argmax, casts.
//! - [`kv_cache`]: the paged KV cache (per layer, model dtype), the K/V write and the causal GQA
//!   prefill attention over it, with the per-batch plan (tiles, positions, block tables)
//!   uploaded once per forward and shared by every layer.
//! - [`capture`]: device staging of the captured layers and their asynchronous download into
//!   pinned host memory on the copy stream.
//!
//! # Adding a kernel
//! Write `src/kernels/cuda/NAME.cu` with `extern "C" __global__` entry points (templates inside
//! are fine; no `#include`: [`nvrtc::COMMON`] — bf16/f16 types and conversions, warp and block
//! reductions — is prepended), add `("NAME", include_str!("NAME.cu"))` to [`nvrtc::SOURCES`],
//! and call it with `launch!`. The NVRTC test compiles every source (no GPU needed).

mod api;
pub use api::{CudaUnavailable, DeviceInfo, limits};

#[cfg(feature = "cuda")]
pub mod capture;
#[cfg(feature = "cuda")]
pub mod context;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub mod gemm;
#[cfg(feature = "cuda")]
pub mod kv_cache;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod ops;
#[cfg(feature = "cuda")]
pub mod recurrent;

#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(feature = "cuda")]
pub use device::{CudaDevice, probe};
#[cfg(feature = "cuda")]
pub use nvrtc::compile_all_for_test;
#[cfg(not(feature = "cuda"))]
pub use stub::probe;

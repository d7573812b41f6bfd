//! The CUDA device (cargo feature `cuda`): [`CudaDevice`] implements the
//! [`Device`](crate::kernels::Device) ops on `.cu` kernels compiled by NVRTC at start-up and
//! cuBLAS GEMMs, through cudarc with dynamic loading (it builds without a CUDA toolkit).
//! Without the feature this module still compiles and [`probe`] answers
//! [`CudaUnavailable::NotBuilt`]. Nothing here knows an architecture or a checkpoint name: the
//! models (src/models/) are written once over the ops.
//!
//! # Layout
//! - `device`, `device_ops`, `device_types`: [`CudaDevice`] and its associated types (activation buffers in
//!   f32 or the compute dtype, linear layers, RoPE tables, the step plan); each op checks its
//!   operands' kinds, shapes and the output's capacity on the host, then calls the launchers.
//! - [`context::Gpu`]: the device context, the compute stream (all compute runs on it, in
//!   order), a side copy stream (capture downloads), the cuBLAS handle and every kernel
//!   function by name ([`context::Gpu::func`]). cudarc's per-buffer event tracking is OFF:
//!   ordering across streams is explicit (events), see [`capture`].
//! - [`context::DevBuf`]: a typed device buffer with bounds-checked raw pointers
//!   ([`context::DevBuf::ptr_at`]); kernels take raw device pointers, so sub-ranges (the q / k
//!   / v columns of fused qkv rows, one layer of the cache) need no views.
//! - [`context::launch!`](crate::kernels::cuda::context): `launch!(gpu, "name", cfg, args...)`.
//! - [`gemm`]: weights on the device in their stored dtype ([`gemm::DevWeight`]) and
//!   `y[M, N] (f32) = x[M, K] · W[N, K]ᵀ` with x and W in f32 / bf16 / f16, f32 accumulation.
//! - [`ops`]: launchers of RMSNorm (+ fused residual add), per-head RMSNorm, RoPE, SwiGLU,
//!   bias add, residual add, the attention output gate, embedding gather, row gather, greedy
//!   argmax, casts.
//! - [`kv_cache`]: the paged KV cache (per layer, compute dtype), the K/V write and the causal
//!   GQA attention over it, with the per-batch plan (tiles, positions, block tables) uploaded
//!   once per forward and shared by every layer.
//! - [`recurrent`]: the recurrent-state slots and the launchers of causal conv1d, the gated
//!   delta rule and the Mamba-2 scan; [`gated_norm`]: their gated norms and relu².
//! - `mamba1`: the Mamba-1 scan op (Mamba, Falcon-Mamba, Jamba; token by token, no chunked
//!   form).
//! - [`recurrent_chunked`]: the gated delta rule and the Mamba-2 scan in blocks of 64
//!   positions (chunked.cu; the default), the token-serial kernels kept for A/B.
//! - [`moe`]: launchers of the MoE router top-k, row gather, shared-expert gate and combine.
//! - [`moe_grouped`]: Nemotron 3's group-limited sigmoid router and the experts' weighted sum.
//! - [`capture`]: captured rows converted to the file dtype into device staging and
//!   downloaded asynchronously into pinned host memory on the copy stream.
//!
//! # Adding a kernel
//! Write `src/kernels/cuda/NAME.cu` with `extern "C" __global__` entry points (templates inside
//! are fine; no `#include`: [`nvrtc::COMMON`] — bf16/f16 types and conversions, warp and block
//! reductions — is prepended), add `("NAME", include_str!("NAME.cu"))` to [`nvrtc::SOURCES`],
//! and call it with `launch!`. The NVRTC test compiles every source (no GPU needed).

mod api;
pub use api::{CudaUnavailable, CudaVersions, DeviceInfo, limits};

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod capture;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod context;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod device;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod device_ops;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod device_types;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod driver;
#[cfg(feature = "cuda")]
mod driver_cudarc;
#[cfg(feature = "cuda-emu")]
mod driver_emu;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod dsa;
#[cfg(all(test, feature = "cuda-emu"))]
mod emu_scheduler_tests;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod gated_norm;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod gemm;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod hyper;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod kv_cache;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod launch_args;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod mamba1;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod moe;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod moe_grouped;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod ops;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod qsa;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod recurrent;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub mod recurrent_chunked;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod table;

#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
mod stub;

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use context::probe;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use context::versions;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use device::CudaDevice;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use device_types::{CudaBuf, CudaLinear, CudaRope, CudaStep};
#[cfg(feature = "cuda-emu")]
pub use driver_emu::fault_next_launch;
#[cfg(feature = "cuda")]
pub use nvrtc::compile_all_for_test;
#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
pub use stub::{probe, versions};
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use table::CudaTable;

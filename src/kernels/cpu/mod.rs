//! CPU device: f32 activations, f32 or bf16 GEMMs (chosen at run time), gemm + rayon.
//!
//! - [`device`]: [`CpuDevice`], the [`Device`](crate::kernels::Device) implementation.
//! - [`matmul`]: row-invariant `A · Wᵀ` on the `gemm` crate (see its docs for the gemm findings).
//! - [`bf16`]: bf16 weights kept as bf16, multiplied on AMX, AVX512-BF16 or widened to f32.
//! - [`ops`]: RMSNorm, RoPE, SiLU·mul, residual add, argmax.
//! - [`kv_cache`]: the paged KV cache.
//! - [`attention`]: causal GQA attention reading the cache only, in a fixed order.
//! - [`recurrent`]: state slots, causal conv, Mamba-2 scan (hybrid models); [`gdn`]: the gated
//!   delta rule; [`vector`]: plain loops compiled for AVX-512F / AVX2 at run time.
//! - [`moe`]: the router's softmax top-k.
//! - [`moe_grouped`]: the group-limited sigmoid router (Nemotron 3) and the experts' weighted sum.
//! - [`capture`]: captured rows into the file dtype, the finite-and-non-empty guard.

pub mod attention;
pub mod bf16;
pub mod capture;
pub mod decay;
pub mod device;
pub mod dsa;
pub mod exp;
pub mod gdn;
pub mod kv_cache;
pub mod mamba;
pub mod mamba1;
pub mod matmul;
pub mod mla;
pub mod moe;
pub mod moe_grouped;
pub mod norm;
pub mod ops;
pub mod qsa;
pub mod recurrent;
pub mod soft_cap;
pub mod unary;
pub mod vector;

pub use device::CpuDevice;

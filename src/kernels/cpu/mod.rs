//! CPU backend: f32 compute, gemm + rayon.
//!
//! - [`matmul`]: row-invariant `A · Wᵀ` on the `gemm` crate (see its docs for the gemm findings).
//! - [`ops`]: RMSNorm, RoPE, SiLU·mul, residual add, argmax.
//! - [`kv_cache`]: the paged KV cache and the checked per-token plan of a batch.
//! - [`attention`]: causal GQA attention reading the cache only, in a fixed order.
//! - [`recurrent`]: state slots, causal conv, gated delta rule, Mamba-2 scan (hybrid models).
//! - [`backend`]: [`CpuBackend`], the [`Backend`](crate::kernels::Backend) implementation.

pub mod attention;
pub mod backend;
pub mod kv_cache;
pub mod matmul;
pub mod ops;
pub mod recurrent;

pub use backend::{CpuBackend, CpuOptions};

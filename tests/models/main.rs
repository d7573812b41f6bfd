//! Model numerics against transformers, byte-identity across batching and chunking, every fixture architecture on every available device.
//!
//! One test binary per area (each links the whole crate once).

#[path = "../common/mod.rs"]
mod common;

mod compressed_tensors;
mod cuda_dense;
mod cuda_hybrid;
mod cuda_lost;
mod cuda_moe;
mod cuda_moe_ops;
mod dense;
mod fp8;
mod gemma4_ple;
mod golden;
mod hybrid;
mod matrix;
mod norm_and_act;
mod qwen4_exp;
mod released_configs;

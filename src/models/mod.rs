//! Model configs, weight loading, the shared layers and one file per architecture, all
//! generic over the device ops ([`crate::kernels::Device`]).
//!
//! - [`config`], [`hybrid_config`], `moe_config`: `config.json` -> [`ModelSpec`], checked at
//!   load.
//! - [`weights`]: `model.safetensors` or an index + shards, tensors as stored.
//! - [`layers`]: attention, MLPs, MoE, Gated DeltaNet, Mamba-2, the loader helper.
//! - [`decoder`]: embedding -> layers (residual stream + capture) -> final norm -> LM head.
//! - [`dense`], [`qwen3_5`], [`nemotron_h`] (+ [`nemotron_moe`]), [`gpt_oss`], [`deepseek_v3`],
//!   [`llama4`]:
//!   the architectures (checkpoint names live here);
//!   [`registry`] maps an architecture to its file.
//! - [`backend`]: [`ModelBackend`], any model on any device as the runner's backend;
//!   [`devices`]: the CPU and CUDA entry points.

pub mod afmoe;
mod afmoe_config;
mod apertus;
mod architecture;
pub mod backend;
pub mod bamba;
mod cfg;
mod cohere;
mod cohere_config;
mod compressed_tensors;
pub mod config;
mod cwm_config;
pub mod decoder;
mod deepseek_config;
pub mod deepseek_v3;
pub mod dense;
mod dense_config;
pub mod devices;
pub mod dsa_config;
mod ernie_config;
mod error;
mod export_config;
pub mod falcon_h1;
mod falcon_h1_config;
pub mod fp8_weights;
pub mod gemma3;
mod gemma3_config;
pub mod gemma4;
mod gemma4_config;
pub mod glm4;
mod gpt_neox;
pub mod gpt_oss;
mod gpt_oss_config;
pub mod granite;
mod granite_config;
mod hunyuan_config;
pub mod hybrid_config;
mod jamba;
mod kimi_config;
pub mod kimi_linear;
mod layer_types;
pub mod layers;
mod lfm2;
mod lfm2_config;
pub mod llama4;
mod llama4_config;
mod longrope_config;
mod mamba;
mod mamba2;
mod mimo_config;
pub mod mimo_v2_flash;
mod minimax_config;
mod mistral_config;
mod moe_config;
mod moe_spec;
pub mod moe_weights;
mod mxfp4;
mod nemotron;
pub mod nemotron_h;
pub mod nemotron_moe;
pub mod ngram_hash;
pub mod olmo;
mod olmo1;
mod olmo_config;
mod phi;
pub mod phi3;
pub mod pyjson;
pub mod qwen3_5;
pub mod qwen4_exp;
mod qwen4_exp_config;
pub mod registry;
mod spec_checks;
mod stablelm_config;
mod starcoder2_config;
pub mod weights;

pub use backend::{Layout, ModelBackend};
pub use config::{
    Architecture, Gemma3Spec, Gemma4Experts, Gemma4Ple, Gemma4Rope, Gemma4Spec, GraniteSpec,
    ModelSpec, QkNorm, RopeScaling, WeightDtype,
};
pub use devices::{CpuBackend, CpuOptions, CudaOptions, cuda_supports, load_cuda};
pub use error::ModelError;
pub use gpt_oss_config::GptOssSpec;
pub use hybrid_config::{HybridSpec, LayerKind};
pub use weights::Weights;

/// The spec of a `config.json` value (named `config.json` in errors): for the config parsers'
/// unit tests.
#[cfg(test)]
pub(crate) fn parse_config(v: &serde_json::Value) -> Result<ModelSpec, ModelError> {
    ModelSpec::from_json(v, std::path::Path::new("config.json"), "m".into())
}

/// `tests/fixtures/released_configs/{file}` (a released `config.json`), read as
/// `ModelSpec::from_dir` reads it (Python's JSON numbers included): for the config parsers'
/// unit tests.
#[cfg(test)]
pub(crate) fn released_config(file: &str) -> serde_json::Value {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/released_configs"
    );
    let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
    pyjson::from_str(&text).unwrap()
}

//! Model configs, weight loading and the architecture families.
//!
//! - [`config`]: `config.json` -> [`ModelSpec`] (dense Llama / Qwen2 / Qwen3 / Mistral).
//! - [`weights`]: `model.safetensors` or an index + shards, tensors widened to f32 once.
//! - [`dense`]: the dense decoder (weights + forward over a packed batch on the CPU kernels).
//! - [`hybrid_config`]: layer patterns and recurrent geometry of the hybrid families.
//! - [`qwen3_5`]: Qwen3.5 / Qwen3-Next (Gated DeltaNet + gated attention, MoE for Next).
//! - [`nemotron_h`]: Nemotron-H (Mamba-2 / attention / MLP blocks).

pub mod config;
pub mod dense;
mod error;
pub(crate) mod head;
pub(crate) mod hybrid_attn;
pub mod hybrid_config;
mod moe;
pub mod nemotron_h;
pub mod qwen3_5;
pub mod weights;

pub use config::{Architecture, ModelSpec, RopeScaling, WeightDtype};
pub use error::ModelError;
pub use hybrid_config::{HybridSpec, LayerKind};
pub use weights::Weights;

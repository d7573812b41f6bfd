//! Model configs, weight loading and the architecture families.
//!
//! - [`config`]: `config.json` -> [`ModelSpec`] (dense Llama / Qwen2 / Qwen3 / Mistral).
//! - [`weights`]: `model.safetensors` or an index + shards, tensors widened to f32 once.
//! - [`dense`]: the dense decoder (weights + forward over a packed batch on the CPU kernels).

pub mod config;
pub mod dense;
mod error;
pub mod weights;

pub use config::{Architecture, ModelSpec, RopeScaling, WeightDtype};
pub use error::ModelError;
pub use weights::Weights;

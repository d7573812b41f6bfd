//! Errors of model loading: each names the file, tensor or field at fault.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("model directory {0} does not exist or is not a directory")]
    MissingDir(PathBuf),
    #[error("{0} not found (a Hugging Face model directory needs a config.json)")]
    MissingConfig(PathBuf),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: field `{field}`: {message}")]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error(
        "{path}: unsupported architecture `{name}` (supported: {})",
        supported_architectures()
    )]
    UnsupportedArchitecture { path: PathBuf, name: String },
    #[error("{path}: unsupported model feature: {what}")]
    Unsupported { path: PathBuf, what: String },
    #[error("no weights in {0}: expected model.safetensors or model.safetensors.index.json")]
    NoWeights(PathBuf),
    #[error("{path}: invalid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("tensor `{name}` not found in the weights of {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {dtype}, only F32, BF16 and F16 are supported")]
    TensorDtype { name: String, dtype: String },
    #[error("invalid backend options: {0}")]
    InvalidOptions(String),
    #[error("{path}: {message}")]
    InvalidConfig { path: PathBuf, message: String },
    #[error("device: {0}")]
    Device(String),
}

impl From<crate::kernels::DeviceError> for ModelError {
    fn from(e: crate::kernels::DeviceError) -> Self {
        ModelError::Device(e.to_string())
    }
}

/// The `architectures` classes hsx loads: every [`super::Architecture`], then the multimodal
/// exports it runs text-only.
fn supported_architectures() -> String {
    let text = super::Architecture::ALL.into_iter().map(|a| a.hf_name());
    let exports = super::export_config::TEXT_OF_MULTIMODAL
        .iter()
        .map(|(e, _)| *e);
    text.chain(exports).collect::<Vec<_>>().join(", ")
}

//! Built without the `cuda` feature: every entry point reports it.

use std::path::Path;

use super::{CudaOptions, CudaUnavailable, DeviceInfo};
use crate::kernels::Backend;
use crate::models::{ModelError, ModelSpec};

/// Always [`CudaUnavailable::NotBuilt`].
pub fn probe(_ordinal: usize) -> Result<DeviceInfo, CudaUnavailable> {
    Err(CudaUnavailable::NotBuilt)
}

/// No architecture runs on CUDA in this build.
pub fn supports(_spec: &ModelSpec) -> bool {
    false
}

/// Always an error naming the missing feature.
pub fn load(
    _dir: &Path,
    _spec: ModelSpec,
    _opts: CudaOptions,
) -> Result<Box<dyn Backend>, ModelError> {
    Err(ModelError::InvalidOptions(
        CudaUnavailable::NotBuilt.to_string(),
    ))
}

//! Built without the `cuda` feature: the probe reports it.

use super::{CudaUnavailable, CudaVersions, DeviceInfo};

/// Always [`CudaUnavailable::NotBuilt`].
pub fn probe(_ordinal: usize) -> Result<DeviceInfo, CudaUnavailable> {
    Err(CudaUnavailable::NotBuilt)
}

/// Nothing is loaded without the feature.
pub fn versions() -> CudaVersions {
    CudaVersions::default()
}

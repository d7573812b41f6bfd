//! Built without the `cuda` feature: the probe reports it.

use super::{CudaUnavailable, DeviceInfo};

/// Always [`CudaUnavailable::NotBuilt`].
pub fn probe(_ordinal: usize) -> Result<DeviceInfo, CudaUnavailable> {
    Err(CudaUnavailable::NotBuilt)
}

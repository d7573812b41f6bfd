//! `CudaDevice::new` without a usable device.

use super::*;

/// Without a usable driver / device, making the device is an error naming why, never a
/// panic (the engine reports it at start).
#[test]
fn new_without_a_usable_device_is_an_error() {
    if let Ok(info) = probe(0) {
        eprintln!("skipping: device {} present", info.name);
        return;
    }
    match CudaDevice::new(0, WeightDtype::Bf16) {
        Ok(_) => panic!("a device without a probe"),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

//! The CUDA device's public types, the same with and without the `cuda` feature.

use thiserror::Error;

/// What the CUDA kernels can hold (the same with and without the feature, so a model can be
/// checked against them anywhere).
pub mod limits {
    /// Largest attention head_dim (query tile and key block in shared memory).
    pub const ATTN_MAX_HEAD_DIM: usize = 256;
    /// Largest dk (Gated DeltaNet) / d_state (Mamba-2) the register-resident scans hold.
    pub const MAX_STATE_DIM: usize = 256;
    /// Largest expert count of `moe_route_f32` (32 lanes × 32 registers).
    pub const MAX_EXPERTS: usize = 1024;
}

/// The device a probe found.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor)
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
    pub device_count: usize,
}

/// Why the CUDA backend cannot run here.
#[derive(Debug, Clone, Error)]
pub enum CudaUnavailable {
    #[error(
        "hsx was built without the `cuda` feature (rebuild with `cargo build --release --features cuda`)"
    )]
    NotBuilt,
    #[error("libcuda.so not found (no NVIDIA driver on this machine, or not on the loader path)")]
    NoDriver,
    #[error(
        "libnvrtc.so not found (install the CUDA NVRTC runtime, e.g. `pip install nvidia-cuda-nvrtc`, and put its lib directory on LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    #[error(
        "libcublas.so not found (install cuBLAS, e.g. `pip install nvidia-cublas`, and put its lib directory on LD_LIBRARY_PATH)"
    )]
    NoCublas,
    #[error("CUDA driver initialisation failed: {0}")]
    Init(String),
    #[error("no CUDA device")]
    NoDevice,
    #[error("CUDA device {ordinal} does not exist ({count} device(s))")]
    BadOrdinal { ordinal: usize, count: usize },
    #[error("CUDA device {ordinal}: {message}")]
    Device { ordinal: usize, message: String },
}

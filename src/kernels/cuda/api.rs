//! The CUDA backend's public types, the same with and without the `cuda` feature.

use thiserror::Error;

/// How to build the CUDA backend (the CPU backend's options plus the device and token budget).
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// Layer ids to capture, ascending, each in `0..=L` (DESIGN.md §1.1).
    pub capture_layers: Vec<usize>,
    /// KV cache blocks per layer.
    pub num_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Recurrent-state slots (hybrid models; ignored for dense ones).
    pub num_state_slots: usize,
    /// Most tokens of one forward (`engine.max_num_batched_tokens`): activation and capture
    /// staging buffers are allocated once for it.
    pub max_num_batched_tokens: usize,
    /// CUDA device ordinal.
    pub device: usize,
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

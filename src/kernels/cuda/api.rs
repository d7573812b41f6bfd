//! The CUDA device's public types, the same with and without the `cuda` feature.

use thiserror::Error;

/// What the CUDA kernels can hold (the same with and without the feature, so a model can be
/// checked against them anywhere).
pub mod limits {
    /// Largest attention head_dim (query tile and key block in shared memory): 512, Gemma 4's
    /// full layers (heads over 256 take the CUDA-core `attention_wide_*` kernels).
    pub const ATTN_MAX_HEAD_DIM: usize = 512;
    /// Largest head_dim of the narrow CUDA-core attention kernels (`attention_*`).
    pub const ATTN_NARROW_HEAD_DIM: usize = 256;
    /// Largest dk (Gated DeltaNet) / d_state (Mamba-2) the register-resident scans hold.
    pub const MAX_STATE_DIM: usize = 256;
    /// Largest expert count of `moe_route_f32` (32 lanes × 32 registers).
    pub const MAX_EXPERTS: usize = 1024;
    /// Largest `n_group` of `moe_route_grouped_f32` (one bit per group).
    pub const MAX_EXPERT_GROUPS: usize = 32;
    /// Gather-only tables (embeddings read by id) larger than this stay in host memory, their
    /// rows gathered there each step (Qwen4-Exp's n-gram table is ~100 GB in the release).
    pub const HOST_TABLE_BYTES: usize = 8 << 30;
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
    #[error(
        "the NVIDIA driver supports CUDA {driver}, older than the {libs} found: install the NVRTC and cuBLAS of CUDA {driver} (e.g. `pip install nvidia-cuda-nvrtc-cu{major} nvidia-cublas-cu{major}`) or a newer driver"
    )]
    VersionMismatch {
        driver: String,
        major: i32,
        libs: String,
    },
    #[error(
        "a test kernel could not be {stage} for sm_{sm} ({versions}): {message}. Install the NVRTC of the CUDA version your driver supports (e.g. `pip install nvidia-cuda-nvrtc-cu12` for a CUDA 12 driver) or a newer driver"
    )]
    ProbeKernel {
        /// "compiled" (NVRTC) or "loaded" (the driver).
        stage: &'static str,
        sm: String,
        versions: String,
        message: String,
    },
}

/// Versions (major, minor) of the CUDA pieces hsx loads; `None` where a library is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CudaVersions {
    /// The newest CUDA the driver supports (`cuDriverGetVersion`).
    pub driver: Option<(i32, i32)>,
    pub nvrtc: Option<(i32, i32)>,
    pub cublas: Option<(i32, i32)>,
}

impl CudaVersions {
    /// The driver must support the CUDA major of NVRTC and cuBLAS: a CUDA 13 NVRTC emits code
    /// and a CUDA 13 cuBLAS needs a runtime that a CUDA 12 driver cannot load.
    pub fn check(&self) -> Result<(), CudaUnavailable> {
        let Some((major, minor)) = self.driver else {
            return Ok(());
        };
        let newer: Vec<String> = [("NVRTC", self.nvrtc), ("cuBLAS", self.cublas)]
            .into_iter()
            .filter_map(|(lib, v)| {
                v.filter(|&(m, _)| m > major)
                    .map(|(m, n)| format!("{lib} {m}.{n}"))
            })
            .collect();
        if newer.is_empty() {
            return Ok(());
        }
        Err(CudaUnavailable::VersionMismatch {
            driver: format!("{major}.{minor}"),
            major,
            libs: newer.join(" and "),
        })
    }

    /// One line: each piece's version or "absent".
    pub fn describe(&self) -> String {
        let v = |x: Option<(i32, i32)>| x.map_or("absent".to_string(), |(a, b)| format!("{a}.{b}"));
        format!(
            "driver CUDA {}, NVRTC {}, cuBLAS {}",
            v(self.driver),
            v(self.nvrtc),
            v(self.cublas)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_older_than_the_libraries_is_refused_with_what_to_install() {
        let v = CudaVersions {
            driver: Some((12, 4)),
            nvrtc: Some((13, 0)),
            cublas: Some((13, 1)),
        };
        let e = v.check().unwrap_err().to_string();
        assert!(
            e.contains("CUDA 12.4") && e.contains("NVRTC 13.0 and cuBLAS 13.1"),
            "{e}"
        );
        assert!(e.contains("nvidia-cuda-nvrtc-cu12"), "{e}");
        let ok = CudaVersions {
            driver: Some((13, 2)),
            ..v
        };
        assert!(ok.check().is_ok());
        // Without a driver there is nothing to compare (the probe reports the driver).
        assert!(CudaVersions::default().check().is_ok());
        assert_eq!(
            CudaVersions::default().describe(),
            "driver CUDA absent, NVRTC absent, cuBLAS absent"
        );
    }

    #[test]
    fn a_probe_kernel_failure_says_what_to_install() {
        let e = CudaUnavailable::ProbeKernel {
            stage: "compiled",
            sm: "120".into(),
            versions: "driver CUDA 12.8, NVRTC 12.4, cuBLAS 12.4".into(),
            message: "invalid value for --gpu-architecture".into(),
        }
        .to_string();
        assert!(e.contains("compiled for sm_120"), "{e}");
        assert!(e.contains("NVRTC 12.4") && e.contains("pip install"), "{e}");
    }
}

//! Checkpoint tensors uploaded once to the device, in the checkpoint's dtype (bf16 and f16 stay
//! 16-bit on the device; norms and biases are widened to f32, they are tiny).

use half::{bf16, f16};

use super::context::{CudaResult, DevBuf, Gpu};
use crate::models::{ModelError, WeightDtype, Weights};

/// A matrix `[rows, cols]` (torch Linear layout `[out, in]`) on the device.
pub struct DevWeight {
    pub data: WeightData,
    pub rows: usize,
    pub cols: usize,
}

/// The elements of a [`DevWeight`]: f32, or the raw 16-bit patterns of bf16 / f16.
pub enum WeightData {
    F32(DevBuf<f32>),
    Bf16(DevBuf<u16>),
    F16(DevBuf<u16>),
}

impl WeightData {
    pub fn dtype(&self) -> WeightDtype {
        match self {
            Self::F32(_) => WeightDtype::F32,
            Self::Bf16(_) => WeightDtype::Bf16,
            Self::F16(_) => WeightDtype::F16,
        }
    }

    pub fn ptr(&self) -> u64 {
        match self {
            Self::F32(b) => b.ptr(),
            Self::Bf16(b) | Self::F16(b) => b.ptr(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::F32(b) => b.len(),
            Self::Bf16(b) | Self::F16(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Error of an upload: a checkpoint problem or a device failure.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Cuda(#[from] super::context::CudaError),
}

impl From<UploadError> for ModelError {
    fn from(e: UploadError) -> Self {
        match e {
            UploadError::Model(m) => m,
            UploadError::Cuda(c) => c.into(),
        }
    }
}

/// Stacks tensors `names` (each `[rows_i, cols]`) into one `[sum rows_i, cols]` weight in
/// `dtype`. A tensor stored in another dtype is converted (bf16 -> f32 -> bf16 is exact, so
/// the common case loses nothing).
pub fn upload_stacked(
    gpu: &Gpu,
    w: &Weights,
    names: &[(String, usize)],
    cols: usize,
    dtype: WeightDtype,
) -> Result<DevWeight, UploadError> {
    let mut host = Vec::new();
    let mut rows = 0;
    for (name, r) in names {
        host.extend(w.tensor(name, &[*r, cols])?);
        rows += r;
    }
    Ok(DevWeight {
        data: upload_as(gpu, &host, dtype)?,
        rows,
        cols,
    })
}

/// One `[rows, cols]` tensor.
pub fn upload_matrix(
    gpu: &Gpu,
    w: &Weights,
    name: &str,
    rows: usize,
    cols: usize,
    dtype: WeightDtype,
) -> Result<DevWeight, UploadError> {
    upload_stacked(gpu, w, &[(name.to_string(), rows)], cols, dtype)
}

/// A vector (norm weight, bias) as f32; several names are concatenated.
pub fn upload_vector(
    gpu: &Gpu,
    w: &Weights,
    names: &[(String, usize)],
) -> Result<DevBuf<f32>, UploadError> {
    let mut host = Vec::new();
    for (name, n) in names {
        host.extend(w.tensor(name, &[*n])?);
    }
    Ok(gpu.upload(&host)?)
}

/// f32 values to the device in `dtype`.
pub fn upload_as(gpu: &Gpu, host: &[f32], dtype: WeightDtype) -> CudaResult<WeightData> {
    Ok(match dtype {
        WeightDtype::F32 => WeightData::F32(gpu.upload(host)?),
        WeightDtype::Bf16 => {
            let bits: Vec<u16> = host.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
            WeightData::Bf16(gpu.upload(&bits)?)
        }
        WeightDtype::F16 => {
            let bits: Vec<u16> = host.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
            WeightData::F16(gpu.upload(&bits)?)
        }
    })
}

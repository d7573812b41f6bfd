//! Element types and RoPE scaling: the vocabulary shared by the models and every device.

use half::{bf16, f16};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// dtype of the weights on disk (also the dtype of the saved hidden states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    Bf16,
    F16,
}

impl WeightDtype {
    /// Parses the torch name (`float32`, `bfloat16`, `float16`, optionally `torch.`-prefixed).
    pub fn from_torch_name(name: &str) -> Option<Self> {
        match name.strip_prefix("torch.").unwrap_or(name) {
            "float32" | "float" => Some(Self::F32),
            "bfloat16" => Some(Self::Bf16),
            "float16" | "half" => Some(Self::F16),
            _ => None,
        }
    }

    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type: "default"` or no scaling).
    None,
    /// Positions interpolated by `factor` (`rope_type: "linear"`: every frequency divided by
    /// it; Gemma-3's full-attention layers).
    Linear { factor: f64 },
    /// Llama 3.x frequency-dependent scaling (transformers `_compute_llama3_parameters`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN (transformers `_compute_yarn_parameters`; gpt-oss): frequencies blended between
    /// extrapolation and interpolation by `factor` over a ramp set by `beta_fast` /
    /// `beta_slow`, and cos / sin scaled by `attention_factor`.
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        original_max_position_embeddings: f64,
        /// Round the ramp's ends to whole dims (transformers' default: true).
        truncate: bool,
        attention_factor: f64,
    },
}

/// Element type of the hidden states written to files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputDtype {
    F32,
    Bf16,
    F16,
    /// float8_e4m3fn codes with one f32 scale per token (`hs_connectors`' layout, [`super::fp8`]).
    Fp8,
}

impl OutputDtype {
    /// Bytes of one value.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
            Self::Fp8 => 1,
        }
    }

    /// Bytes of one token's row of `layers × hidden` values as held in host memory: the
    /// values, and for fp8 the token's scale after them. `None` on overflow.
    pub fn row_bytes(self, layers: usize, hidden: usize) -> Option<usize> {
        let values = layers.checked_mul(hidden)?.checked_mul(self.size())?;
        match self {
            Self::Fp8 => values.checked_add(super::fp8::SCALE_BYTES),
            _ => Some(values),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::Fp8 => "fp8",
        }
    }
}

/// Little-endian bytes -> f32 values, in parallel on the current rayon pool (a trailing
/// partial element is dropped; the caller checks the count).
pub fn widen(bytes: &[u8], dtype: WeightDtype) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let size = dtype_size(dtype);
    let mut out = vec![0.0f32; bytes.len() / size];
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * size))
        .for_each(|(o, b)| widen_into(b, dtype, o));
    out
}

/// f32 values -> little-endian `dtype` bytes into `out` (`values.len()` elements; round to
/// nearest even when narrowing).
pub fn narrow_into(values: &[f32], dtype: WeightDtype, out: &mut [u8]) {
    let size = dtype_size(dtype);
    for (&v, o) in values.iter().zip(out.chunks_exact_mut(size)) {
        match dtype {
            WeightDtype::F32 => o.copy_from_slice(&v.to_le_bytes()),
            WeightDtype::Bf16 => o.copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
            WeightDtype::F16 => o.copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
        }
    }
}

/// Bytes per element of a stored dtype.
pub fn dtype_size(d: WeightDtype) -> usize {
    match d {
        WeightDtype::F32 => 4,
        WeightDtype::Bf16 | WeightDtype::F16 => 2,
    }
}

pub(crate) fn widen_into(bytes: &[u8], dtype: WeightDtype, out: &mut [f32]) {
    match dtype {
        WeightDtype::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WeightDtype::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        WeightDtype::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widen_all_dtypes() {
        let x = [1.5f32, -2.25, 0.0];
        let f32_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(widen(&f32_bytes, WeightDtype::F32), x);
        let bf: Vec<u8> = x
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        assert_eq!(widen(&bf, WeightDtype::Bf16), x);
        let h: Vec<u8> = x
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        assert_eq!(widen(&h, WeightDtype::F16), x);
    }
}

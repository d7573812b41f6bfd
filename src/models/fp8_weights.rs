//! FP8 checkpoints (`quantization_config.quant_method: "fp8"`): block-quantized, the format of
//! DeepSeek-V3 / R1, Kimi-K2, MiniMax-M2 and the Qwen3 / GLM `-FP8` releases — a linear
//! layer's `weight` holds float8_e4m3fn codes and `weight_scale_inv` one f32 (or bf16) scale
//! per block of `weight_block_size` `[rows, cols]` values, the last blocks of a row or column
//! possibly short (DeepSeek-V3's `kv_a_proj_with_mqa` has 576 rows: 5 row blocks of 128) —
//! or per-tensor, Mistral's (Ministral 3, Devstral 2): one `weight_scale_inv` value per
//! matrix, with an `activation_scale` for its static activation scheme.
//!
//! hsx dequantizes each weight at load to the model's dtype (`torch_dtype`), as transformers
//! does when it cannot run FP8 (`FineGrainedFP8Config(dequantize=True)`): `code · scale`
//! in f32, rounded once to that dtype. The model then runs as its bf16 release would.
//! Activations are not quantized (a static scheme's `activation_scale`s are not read, as
//! transformers' dequantized run does not read them).

use std::borrow::Cow;

use rayon::prelude::*;
use serde_json::Value;

use super::{ModelError, WeightDtype};
use crate::kernels::device::HostMatrix;
use crate::kernels::dtype::{dtype_size, narrow_into};
use crate::kernels::fp8::e4m3fn_to_f32;

/// `weight_block_size`: values per scale along rows and along columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Blocks {
    pub rows: usize,
    pub cols: usize,
}

impl Fp8Blocks {
    /// The scale grid of a `[rows, cols]` weight: one scale per block, short blocks included.
    pub fn grid(&self, rows: usize, cols: usize) -> [usize; 2] {
        [rows.div_ceil(self.rows), cols.div_ceil(self.cols)]
    }
}

/// The blocks of an fp8 `quantization_config` (`None` for any other method). Refuses what
/// dequantizing at load cannot reproduce: another `fmt` than e4m3, an activation scheme
/// neither `dynamic` nor `static`, a malformed `weight_block_size`. `err(field, message)`
/// builds the caller's error.
pub fn fp8_blocks(
    q: &Value,
    err: impl Fn(&str, String) -> ModelError,
) -> Result<Option<Fp8Blocks>, ModelError> {
    if q.get("quant_method").and_then(Value::as_str) != Some("fp8") {
        return Ok(None);
    }
    let field = |f: &str| q.get(f).filter(|v| !v.is_null());
    // DeepSeek-V3 writes `e4m3`, MiniMax-M2 the torch dtype's name.
    if let Some(fmt) = field("fmt")
        && !matches!(fmt.as_str(), Some("e4m3" | "float8_e4m3fn"))
    {
        let msg = format!("{fmt}: hsx reads float8_e4m3fn weights only");
        return Err(err("quantization_config.fmt", msg));
    }
    // `static`: Mistral's releases store an `activation_scale` per linear layer, which
    // transformers' dequantized run does not read (nor does hsx).
    if let Some(scheme) = field("activation_scheme")
        && !matches!(scheme.as_str(), Some("dynamic" | "static"))
    {
        let msg = format!("{scheme}: only `dynamic` or `static`");
        return Err(err("quantization_config.activation_scheme", msg));
    }
    // FineGrainedFP8Config's default.
    let Some(size) = q.get("weight_block_size").filter(|v| !v.is_null()) else {
        return Ok(Some(Fp8Blocks {
            rows: 128,
            cols: 128,
        }));
    };
    let dims: Option<Vec<usize>> = size.as_array().filter(|a| a.len() == 2).and_then(|a| {
        a.iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect()
    });
    match dims.as_deref() {
        Some(&[rows, cols]) if rows > 0 && cols > 0 => Ok(Some(Fp8Blocks { rows, cols })),
        _ => Err(err(
            "quantization_config.weight_block_size",
            format!("expected [rows, cols] > 0, found {size}"),
        )),
    }
}

/// The `[rows, cols]` weight `name` from its e4m3 `codes` and the f32 `scales` of its block
/// grid, in `dtype`. NaN codes or non-finite scales are refused: they would make every state
/// downstream NaN.
pub fn dequantize(
    name: &str,
    codes: &[u8],
    scales: &[f32],
    (rows, cols): (usize, usize),
    blocks: Fp8Blocks,
    dtype: WeightDtype,
) -> Result<HostMatrix<'static>, ModelError> {
    let bad = |m: String| ModelError::InvalidOptions(format!("FP8 weight `{name}`: {m}"));
    let [grid_rows, grid_cols] = blocks.grid(rows, cols);
    if codes.len() != rows * cols || scales.len() != grid_rows * grid_cols {
        let (n, s) = (codes.len(), scales.len());
        return Err(bad(format!(
            "{n} codes and {s} scales for [{rows}, {cols}]"
        )));
    }
    if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
        return Err(bad(format!("scale {i} is {}", scales[i])));
    }
    // e4m3fn's NaN is S.1111.111; it has no infinities.
    if let Some(i) = codes.iter().position(|&c| c & 0x7f == 0x7f) {
        return Err(bad(format!("value {i} is NaN")));
    }
    let table: Vec<f32> = (0..=255u8).map(e4m3fn_to_f32).collect();
    let width = cols.max(1);
    Ok(dequantized_rows((rows, cols), dtype, |r| {
        let s = &scales[r / blocks.rows * grid_cols..][..grid_cols];
        let row = &codes[r * width..][..cols];
        (row.iter().enumerate())
            .map(|(c, &code)| table[usize::from(code)] * s[c / blocks.cols])
            .collect()
    }))
}

/// A `[rows, cols]` matrix in `dtype` whose row `r` is `row(r)` (f32 values, each rounded
/// once): the rows made in parallel, each narrowed as it is made (no f32 copy of the whole
/// matrix).
pub(super) fn dequantized_rows(
    (rows, cols): (usize, usize),
    dtype: WeightDtype,
    row: impl Fn(usize) -> Vec<f32> + Sync,
) -> HostMatrix<'static> {
    let mut data = vec![0u8; rows * cols * dtype_size(dtype)];
    data.par_chunks_mut((cols * dtype_size(dtype)).max(1))
        .enumerate()
        .for_each(|(r, out)| narrow_into(&row(r), dtype, out));
    HostMatrix {
        dtype,
        rows,
        cols,
        data: Cow::Owned(data),
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use serde_json::json;

    use super::*;

    fn blocks(q: Value) -> Result<Option<Fp8Blocks>, String> {
        fp8_blocks(&q, |f, m| ModelError::InvalidOptions(format!("{f}: {m}")))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn config_blocks_defaults_and_refusals() {
        let deepseek = json!({"activation_scheme": "dynamic", "fmt": "e4m3",
            "quant_method": "fp8", "weight_block_size": [128, 128]});
        let b = blocks(deepseek).unwrap().unwrap();
        assert_eq!((b.rows, b.cols), (128, 128));
        assert_eq!(b.grid(576, 7168), [5, 56]);
        let b = blocks(json!({"quant_method": "fp8", "weight_block_size": [16, 32]})).unwrap();
        assert_eq!(b, Some(Fp8Blocks { rows: 16, cols: 32 }));
        assert_eq!(
            blocks(json!({"quant_method": "fp8"})).unwrap(),
            Some(Fp8Blocks {
                rows: 128,
                cols: 128
            })
        );
        let minimax = json!({"activation_scheme": "dynamic", "fmt": "float8_e4m3fn",
            "quant_method": "fp8", "weight_block_size": [128, 128],
            "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]});
        assert_eq!(blocks(minimax).unwrap().map(|b| b.rows), Some(128));
        assert_eq!(blocks(json!({"quant_method": "mxfp4"})).unwrap(), None);
        for (q, field) in [
            (json!({"quant_method": "fp8", "fmt": "e5m2"}), "fmt"),
            (json!({"quant_method": "fp8", "fmt": "float8_e5m2"}), "fmt"),
            (
                json!({"quant_method": "fp8", "activation_scheme": "per_token"}),
                "activation_scheme",
            ),
            (
                json!({"quant_method": "fp8", "weight_block_size": [128]}),
                "weight_block_size",
            ),
            (
                json!({"quant_method": "fp8", "weight_block_size": [0, 128]}),
                "weight_block_size",
            ),
        ] {
            assert!(blocks(q).unwrap_err().contains(field), "{field}");
        }
    }

    /// A 3 × 5 weight in blocks of 2 × 2 (short last blocks): each value is its code times its
    /// block's scale, rounded once to bf16.
    #[test]
    fn each_value_takes_its_blocks_scale_then_one_rounding() {
        let b = Fp8Blocks { rows: 2, cols: 2 };
        let codes: Vec<u8> = (0..15).map(|i| 0x30 + i as u8).collect();
        let scales = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
        let m = dequantize("w", &codes, &scales, (3, 5), b, WeightDtype::Bf16).unwrap();
        assert_eq!((m.dtype, m.rows, m.cols), (WeightDtype::Bf16, 3, 5));
        let got: &[bf16] = bytemuck::cast_slice(&m.data);
        for r in 0..3 {
            for c in 0..5 {
                let s = scales[(r / 2) * 3 + c / 2];
                let want = bf16::from_f32(e4m3fn_to_f32(codes[r * 5 + c]) * s);
                assert_eq!(got[r * 5 + c].to_bits(), want.to_bits(), "({r}, {c})");
            }
        }
        let f = dequantize("w", &codes, &scales, (3, 5), b, WeightDtype::F32).unwrap();
        let f: &[f32] = bytemuck::cast_slice(&f.data);
        assert_eq!(f[14], e4m3fn_to_f32(codes[14]) * 0.6);
    }

    #[test]
    fn nan_codes_and_bad_scales_are_refused() {
        let b = Fp8Blocks { rows: 1, cols: 2 };
        let e = dequantize("w", &[0x7f, 0], &[1.0], (1, 2), b, WeightDtype::Bf16);
        assert!(e.unwrap_err().to_string().contains("NaN"));
        let e = dequantize("w", &[0xff, 0], &[1.0], (1, 2), b, WeightDtype::Bf16);
        assert!(e.is_err());
        let e = dequantize("w", &[1, 0], &[f32::INFINITY], (1, 2), b, WeightDtype::Bf16);
        assert!(e.unwrap_err().to_string().contains("scale 0"));
    }
}

//! compressed-tensors checkpoints (`quant_method: "compressed-tensors"`) of quantized weights,
//! in two formats:
//! - `pack-quantized`, integer weights (W4A16 / W8A16: Kimi-K2-Thinking's and Kimi-K2.5's
//!   routed experts, many community INT4 releases). A quantized linear layer stores, instead of
//!   `weight`: `weight_packed`, int32 words of `32 / num_bits` values (value `i` of a row at
//!   bits `num_bits · i` of the row's little-endian words, stored plus `2^(num_bits - 1)`);
//!   `weight_scale`, one scale per group of `group_size` input values (`strategy: "group"`) or
//!   per output row (`"channel"`); `weight_shape`, the `[rows, cols]` of the weight.
//! - `float-quantized`, float8_e4m3fn weights (llm-compressor's `-FP8-dynamic` releases): `weight` holds the codes and `weight_scale` one scale per tensor, output
//!   row, group of inputs or block ([`super::fp8_weights`] dequantizes them as the FP8
//!   releases' blocks). Their activations are quantized by an FP8 GPU at run time (`dynamic`);
//!   transformers' decompressed run does not, nor does hsx.
//!
//! Layers the config's `ignore` list names keep a plain `weight`: hsx reads whichever a layer
//! has. Each quantized weight is dequantized at load to the model's dtype as transformers'
//! decompressed load (`CompressedTensorsConfig(dequantize=True)`) makes it: `code · scale`,
//! rounded once. The model then runs as a bf16 model with those weights.

use serde_json::Value;

use super::fp8_weights::{Fp8Blocks, dequantized_rows};
use super::{ModelError, WeightDtype};
use crate::kernels::device::HostMatrix;

/// How the integer weights are laid out: bits per value and the input values per scale
/// (`None`: one scale per row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedInt {
    pub bits: u32,
    pub group: Option<usize>,
}

impl PackedInt {
    /// Words of `weight_packed` per row of `cols` values.
    pub fn words(&self, cols: usize) -> usize {
        (cols * self.bits as usize).div_ceil(32)
    }

    /// Scales per row of `cols` values.
    pub fn scales(&self, cols: usize) -> usize {
        self.group.map_or(1, |g| cols.div_ceil(g))
    }
}

/// A compressed-tensors checkpoint's weights: packed integers, or float8 codes whose
/// `weight_scale`s cover blocks of the matrix (a whole row or the whole matrix where a block
/// dimension is `usize::MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressed {
    Int(PackedInt),
    Float(Fp8Blocks),
}

/// The weights of a compressed-tensors `quantization_config` (`None` for any other method).
/// Refuses what dequantizing at load cannot reproduce: another format, quantized outputs or
/// KV cache, activations quantized other than FP8's dynamic way (or at all, for integers),
/// asymmetric weights, an activation order (`g_idx`), groups of different layouts.
/// `err(field, message)` builds the caller's error.
pub fn compressed(
    q: &Value,
    err: impl Fn(&str, String) -> ModelError,
) -> Result<Option<Compressed>, ModelError> {
    if q.get("quant_method").and_then(Value::as_str) != Some("compressed-tensors") {
        return Ok(None);
    }
    let at = |f: &str| format!("quantization_config.{f}");
    let float = match q.get("format").and_then(Value::as_str) {
        Some("pack-quantized") => false,
        Some("float-quantized") => true,
        other => {
            let msg = format!("{other:?}: hsx reads `pack-quantized` and `float-quantized`");
            return Err(err(&at("format"), msg));
        }
    };
    if q.get("kv_cache_scheme").is_some_and(|v| !v.is_null()) {
        return Err(err(&at("kv_cache_scheme"), "a quantized KV cache".into()));
    }
    let groups = (q.get("config_groups").and_then(Value::as_object))
        .filter(|g| !g.is_empty())
        .ok_or_else(|| err(&at("config_groups"), "expected a non-empty object".into()))?;
    let mut layout = None;
    for (name, g) in groups {
        let field = at(&format!("config_groups.{name}"));
        let this = group_layout(g, float).map_err(|m| err(&field, m))?;
        if layout.is_some_and(|l| l != this) {
            return Err(err(&field, "groups of different layouts".into()));
        }
        layout = Some(this);
    }
    Ok(layout)
}

/// One config group's weights: symmetric integers of 4 or 8 bits per group or per channel
/// (activations left alone), or float8 per tensor, channel, group or block (activations left
/// alone or quantized dynamically).
fn group_layout(g: &Value, float: bool) -> Result<Compressed, String> {
    if g.get("output_activations").is_some_and(|v| !v.is_null()) {
        return Err("quantized output_activations".into());
    }
    if let Some(a) = g.get("input_activations").filter(|v| !v.is_null()) {
        let dynamic_fp8 = a.get("type").and_then(Value::as_str) == Some("float")
            && a.get("dynamic").and_then(Value::as_bool) == Some(true);
        if !(float && dynamic_fp8) {
            let msg = "quantized input_activations (hsx runs weight-only quantization and FP8's dynamic activations unquantized)";
            return Err(msg.into());
        }
    }
    let w = g.get("weights").ok_or("no `weights`")?;
    let s = |k: &str| w.get(k).and_then(Value::as_str);
    let bits = w.get("num_bits").and_then(Value::as_u64);
    let group = w.get("group_size").and_then(Value::as_u64);
    let (kind, widths) = if float {
        ("float", "8")
    } else {
        ("int", "4 or 8")
    };
    let fails = [
        (
            s("type") != Some(kind),
            format!("weights.type {:?} (only {kind} in this format)", s("type")),
        ),
        (
            !matches!((float, bits), (true, Some(8)) | (false, Some(4 | 8))),
            format!("weights.num_bits {bits:?} ({widths})"),
        ),
        (
            w.get("symmetric").and_then(Value::as_bool) != Some(true),
            "asymmetric weights (zero points)".into(),
        ),
        (
            w.get("dynamic").and_then(Value::as_bool) == Some(true),
            "dynamic weight quantization".into(),
        ),
        (
            w.get("actorder").is_some_and(|v| !v.is_null()),
            "an activation order (g_idx)".into(),
        ),
    ];
    if let Some((_, why)) = fails.into_iter().find(|(bad, _)| *bad) {
        return Err(why);
    }
    let group = group.filter(|&g| g > 0).map(|g| g as usize);
    let whole = usize::MAX;
    let blocks = |rows, cols| Compressed::Float(Fp8Blocks { rows, cols });
    match (s("strategy"), group, float) {
        (Some("group"), Some(g), false) => Ok(Compressed::Int(PackedInt {
            bits: bits.unwrap_or(4) as u32,
            group: Some(g),
        })),
        (Some("channel"), _, false) => Ok(Compressed::Int(PackedInt {
            bits: bits.unwrap_or(4) as u32,
            group: None,
        })),
        (Some("tensor"), _, true) => Ok(blocks(whole, whole)),
        (Some("channel"), _, true) => Ok(blocks(1, whole)),
        (Some("group"), Some(g), true) => Ok(blocks(1, g)),
        (Some("block"), _, true) => match block_structure(w) {
            Some((r, c)) => Ok(blocks(r, c)),
            None => Err(format!(
                "weights.block_structure {:?} ([rows, cols] > 0)",
                w.get("block_structure")
            )),
        },
        (strategy, group, _) => Err(format!(
            "weights.strategy {strategy:?} with group_size {group:?} (group with a size, channel{})",
            if float { ", tensor or block" } else { "" }
        )),
    }
}

/// `block_structure` `[rows, cols]`, both above 0.
fn block_structure(w: &Value) -> Option<(usize, usize)> {
    let dims = w.get("block_structure")?.as_array()?;
    match dims
        .iter()
        .map(Value::as_u64)
        .collect::<Option<Vec<u64>>>()?
        .as_slice()
    {
        &[r, c] if r > 0 && c > 0 => Some((r as usize, c as usize)),
        _ => None,
    }
}

/// The `[rows, cols]` weight `name` from its packed `words` (little-endian int32 bytes,
/// [`PackedInt::words`] per row) and f32 `scales` ([`PackedInt::scales`] per row), in `dtype`.
/// Non-finite scales are refused: they would make every state downstream NaN.
pub fn dequantize(
    name: &str,
    words: &[u8],
    scales: &[f32],
    (rows, cols): (usize, usize),
    p: PackedInt,
    dtype: WeightDtype,
) -> Result<HostMatrix<'static>, ModelError> {
    let bad = |m: String| ModelError::InvalidOptions(format!("packed weight `{name}`: {m}"));
    let (row_bytes, per_row) = (4 * p.words(cols), p.scales(cols));
    if words.len() != rows * row_bytes || scales.len() != rows * per_row {
        let (w, s) = (words.len(), scales.len());
        return Err(bad(format!(
            "{w} bytes and {s} scales for [{rows}, {cols}]"
        )));
    }
    if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
        return Err(bad(format!("scale {i} is {}", scales[i])));
    }
    let (bits, group) = (p.bits as usize, p.group.unwrap_or(cols.max(1)));
    let (mask, offset) = ((1u32 << bits) - 1, 1i32 << (bits - 1));
    // 4- and 8-bit values never straddle a byte: value i is in byte `bits · i / 8`
    // (little-endian words: byte order is bit order).
    Ok(dequantized_rows((rows, cols), dtype, |r| {
        let (row, s) = (&words[r * row_bytes..], &scales[r * per_row..]);
        (0..cols)
            .map(|c| {
                let bit = c * bits;
                let v = (u32::from(row[bit / 8]) >> (bit % 8)) & mask;
                (v as i32 - offset) as f32 * s[c / group]
            })
            .collect()
    }))
}

#[cfg(test)]
#[path = "compressed_tensors_tests.rs"]
mod tests;

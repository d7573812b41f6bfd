//! compressed-tensors checkpoints of integer weights (`quant_method: "compressed-tensors"`,
//! `format: "pack-quantized"`, no activation quantization: W4A16 / W8A16), the format of
//! Kimi-K2-Thinking's and Kimi-K2.5's routed experts and of many community INT4 releases.
//! A quantized linear layer stores, instead of `weight`:
//! - `weight_packed`: int32 words, `32 / num_bits` values each; value `i` of a row is at bits
//!   `num_bits · i` of the row's little-endian words, stored plus `2^(num_bits - 1)`;
//! - `weight_scale`: one scale per group of `group_size` input values (`strategy: "group"`), or
//!   one per output row (`"channel"`);
//! - `weight_shape`: the `[rows, cols]` of the weight.
//!
//! Layers the config's `ignore` list names keep a plain `weight`: hsx reads whichever a layer
//! has. Each packed weight is dequantized at load to the model's dtype as transformers'
//! decompressed load (`CompressedTensorsConfig(run_compressed=False)`) makes it: `code · scale`,
//! rounded once. The model then runs as a bf16 model with those weights.

use serde_json::Value;

use super::fp8_weights::dequantized_rows;
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

/// The integer layout of a compressed-tensors `quantization_config` (`None` for any other
/// method). Refuses what dequantizing at load cannot reproduce: another format than
/// `pack-quantized`, quantized activations, asymmetric or float weights, an activation order
/// (`g_idx`), groups of different layouts. `err(field, message)` builds the caller's error.
pub fn packed_int(
    q: &Value,
    err: impl Fn(&str, String) -> ModelError,
) -> Result<Option<PackedInt>, ModelError> {
    if q.get("quant_method").and_then(Value::as_str) != Some("compressed-tensors") {
        return Ok(None);
    }
    let at = |f: &str| format!("quantization_config.{f}");
    let format = q.get("format").and_then(Value::as_str);
    if format != Some("pack-quantized") {
        let msg = format!("{format:?}: hsx reads `pack-quantized` integer weights only");
        return Err(err(&at("format"), msg));
    }
    if q.get("kv_cache_scheme").is_some_and(|v| !v.is_null()) {
        return Err(err(&at("kv_cache_scheme"), "a quantized KV cache".into()));
    }
    let groups = (q.get("config_groups").and_then(Value::as_object))
        .filter(|g| !g.is_empty())
        .ok_or_else(|| err(&at("config_groups"), "expected a non-empty object".into()))?;
    let mut layout = None;
    for (name, g) in groups {
        let field = at(&format!("config_groups.{name}"));
        let this = group_layout(g).map_err(|m| err(&field, m))?;
        if layout.is_some_and(|l| l != this) {
            return Err(err(&field, "groups of different layouts".into()));
        }
        layout = Some(this);
    }
    Ok(layout)
}

/// One config group's weights: symmetric integers of 4 or 8 bits per group or per channel,
/// activations left alone.
fn group_layout(g: &Value) -> Result<PackedInt, String> {
    for side in ["input_activations", "output_activations"] {
        if g.get(side).is_some_and(|v| !v.is_null()) {
            return Err(format!(
                "quantized {side} (hsx runs weight-only quantization)"
            ));
        }
    }
    let w = g.get("weights").ok_or("no `weights`")?;
    let s = |k: &str| w.get(k).and_then(Value::as_str);
    let bits = w.get("num_bits").and_then(Value::as_u64);
    let group = w.get("group_size").and_then(Value::as_u64);
    let fails = [
        (
            s("type") != Some("int"),
            format!("weights.type {:?} (only int)", s("type")),
        ),
        (
            !matches!(bits, Some(4 | 8)),
            format!("weights.num_bits {bits:?} (4 or 8)"),
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
    let bits = bits.unwrap_or(4) as u32;
    match (s("strategy"), group) {
        (Some("group"), Some(g)) if g > 0 => Ok(PackedInt {
            bits,
            group: Some(g as usize),
        }),
        (Some("channel"), _) => Ok(PackedInt { bits, group: None }),
        (strategy, group) => Err(format!(
            "weights.strategy {strategy:?} with group_size {group:?} (group with a size, or channel)"
        )),
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
#[path = "packed_int_weights_tests.rs"]
mod tests;

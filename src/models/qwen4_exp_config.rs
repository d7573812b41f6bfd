//! Qwen4-Exp's fields beyond Qwen3.5-MoE's (`Qwen4ExpTextConfig`, transformers 5.24): the
//! hyper-connections (`hc_count`, `hc_lowrank`), the QSA indexer (`indexer_*`), the hashed
//! n-gram per-layer embeddings (`ple_layer_ids`, …) and the linear-attention output gate.
//!
//! What hsx runs, and what it refuses:
//! - the QSA indexer on every attention layer picks, for each query, the `indexer_budget /
//!   indexer_compress_ratio` best-scoring complete blocks of `indexer_compress_ratio` keys,
//!   plus the keys of the incomplete last block ([`crate::kernels::qsa`]): every key while a
//!   query sees at most `budget + ratio - 1`;
//! - `ple_layer_ids` (one-indexed, Gated DeltaNet layers only) get the hashed n-gram
//!   embeddings ([`NgramSpec`], [`super::ngram_hash`]);
//! - the linear-attention norm's output gate is `output_gate_type` (else `hidden_act`): SiLU
//!   or sigmoid (the release's).

use serde_json::Value;

use super::ModelError;
use super::config::{Cfg, HyperSpec, ModelSpec, QsaSpec};
use super::hybrid_config::{LayerKind, NormGate};
use super::ngram_hash::NgramParams;
use crate::kernels::CHUNK_CONTEXT;

/// `spec` (parsed as Qwen3.5-MoE's fields) with Qwen4-Exp's.
pub(super) fn parse(cfg: &Cfg<'_>, mut spec: ModelSpec) -> Result<ModelSpec, ModelError> {
    let streams = cfg.usize_or("hc_count", 4)?;
    if streams <= 1 {
        return Err(cfg.err(
            "hc_count",
            format!("{streams}: Qwen4-Exp needs more than 1"),
        ));
    }
    let rank = cfg.usize_or("hc_lowrank", 320)?;
    if rank == 0 {
        return Err(cfg.err("hc_lowrank", "0"));
    }
    spec.hyper = Some(HyperSpec { streams, rank });
    spec.ngram = ngram(cfg, &spec)?;
    let gate = cfg
        .get("output_gate_type")
        .or_else(|| cfg.get("hidden_act"));
    let out_gate = match gate.and_then(Value::as_str).unwrap_or("silu") {
        "silu" => NormGate::Silu,
        "sigmoid" => NormGate::Sigmoid,
        other => {
            let msg = format!("`{other}` (Qwen4-Exp's are sigmoid and silu)");
            return Err(cfg.err("output_gate_type", msg));
        }
    };
    let gdn = (spec.hybrid.as_mut()).and_then(|h| h.gdn.as_mut());
    gdn.ok_or_else(|| cfg.err("layer_types", "no Gated DeltaNet geometry"))?
        .out_gate = out_gate;
    spec.qsa = Some(qsa(cfg, &spec)?);
    Ok(spec)
}

/// Qwen4-Exp's hashed n-gram embeddings (PLE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramSpec {
    /// The decoder layers (from 0) that add them, in order.
    pub layers: Vec<usize>,
    /// `ple_embed_dim`: every head's rows side by side.
    pub embed_dim: usize,
    /// `ple_conv_kernel_size`; the conv's dilation is `ngram_size`.
    pub conv_kernel: usize,
    /// `split_ngram_parts`: the pieces a release stores each table in.
    pub parts: usize,
    pub hash: NgramParams,
}

impl NgramSpec {
    /// Ids (table rows) per token.
    pub fn heads(&self) -> usize {
        (self.hash.ngram_size - 1) * self.hash.heads_per_ngram
    }
}

/// `ple_layer_ids` and the n-gram fields; `None` when no layer has them.
fn ngram(cfg: &Cfg<'_>, spec: &ModelSpec) -> Result<Option<NgramSpec>, ModelError> {
    let field = "ple_layer_ids";
    let mut ids = match cfg.get(field) {
        None => Vec::new(),
        Some(v) => (v
            .as_array()
            .ok_or_else(|| cfg.err(field, "expected a list")))?
        .iter()
        .map(|x| {
            x.as_u64()
                .ok_or_else(|| cfg.err(field, format!("entry {x}")))
        })
        .collect::<Result<Vec<u64>, _>>()?,
    };
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(None);
    }
    let kinds = &spec
        .hybrid
        .as_ref()
        .ok_or_else(|| cfg.err(field, "no layers"))?
        .layers;
    let layers = (ids.iter())
        .map(
            |&id| match (id as usize).checked_sub(1).filter(|&i| i < kinds.len()) {
                Some(i) if kinds[i] == LayerKind::GatedDeltaNet => Ok(i),
                Some(i) => Err(cfg.err(field, format!("{id}: layer {i} is not linear attention"))),
                None => Err(cfg.err(field, format!("{id} outside 1..={}", kinds.len()))),
            },
        )
        .collect::<Result<Vec<_>, _>>()?;
    let ngram_size = cfg.usize_or("ngram_size", 3)?;
    if !(2..=CHUNK_CONTEXT + 1).contains(&ngram_size) {
        let msg = format!("{ngram_size} (hsx takes 2..={})", CHUNK_CONTEXT + 1);
        return Err(cfg.err("ngram_size", msg));
    }
    let eos = match cfg.get("eos_token_id") {
        Some(Value::Array(a)) => a.first().and_then(Value::as_u64),
        Some(v) => v.as_u64(),
        None => None,
    };
    let eos = eos.filter(|&e| e < spec.vocab_size as u64);
    let eos = eos.ok_or_else(|| cfg.err("eos_token_id", "a token id is needed with PLE"))?;
    let hash = NgramParams {
        vocab: spec.vocab_size,
        ngram_size,
        heads_per_ngram: cfg.positive_or("heads_per_ngram", 8)?,
        vocab_base: cfg.positive_or("ngram_vocab_size_base", 20_000_000)? as u64,
        divisor: cfg.positive_or("make_ngram_vocab_size_divisible_by", 128)? as u64,
        seed: cfg.usize_or("seed", 1234)? as u64,
        eos: eos as u32,
    };
    let s = NgramSpec {
        layers,
        embed_dim: cfg.positive_or("ple_embed_dim", spec.hidden_size)?,
        conv_kernel: cfg.positive_or("ple_conv_kernel_size", 4)?,
        parts: cfg.positive_or("split_ngram_parts", 512)?,
        hash,
    };
    if !s.embed_dim.is_multiple_of(s.heads()) {
        let msg = format!(
            "{} is not a multiple of the {} n-gram heads",
            s.embed_dim,
            s.heads()
        );
        return Err(cfg.err("ple_embed_dim", msg));
    }
    Ok(Some(s))
}

/// The QSA indexer's fields, all required (transformers cannot build the model without them).
fn qsa(cfg: &Cfg<'_>, spec: &ModelSpec) -> Result<QsaSpec, ModelError> {
    let field = |name: &str| {
        let v = cfg.usize_req(name)?;
        match v {
            0 => Err(cfg.err(name, "must be positive")),
            v => Ok(v),
        }
    };
    let heads = field("indexer_n_heads")?;
    let (kv_heads, head_dim) = (field("indexer_kv_heads")?, field("indexer_head_dim")?);
    let (budget, ratio) = (field("indexer_budget")?, field("indexer_compress_ratio")?);
    if kv_heads != 1 {
        return Err(cfg.err("indexer_kv_heads", format!("{kv_heads}: QSA needs 1")));
    }
    if !budget.is_multiple_of(ratio) {
        let msg = format!("{budget} is not a multiple of indexer_compress_ratio {ratio}");
        return Err(cfg.err("indexer_budget", msg));
    }
    let rotary = spec.hybrid.as_ref().map_or(spec.head_dim, |h| h.rotary_dim);
    if rotary > head_dim {
        let msg = format!("{head_dim} is narrower than the attention's {rotary} rotary dims");
        return Err(cfg.err("indexer_head_dim", msg));
    }
    budget
        .checked_add(ratio)
        .ok_or_else(|| cfg.err("indexer_budget", "too large"))?;
    Ok(QsaSpec {
        heads,
        head_dim,
        budget,
        ratio,
    })
}

#[cfg(test)]
#[path = "qwen4_exp_config_tests.rs"]
mod tests;

//! Qwen4-Exp's fields beyond Qwen3.5-MoE's (`Qwen4ExpTextConfig`, transformers 5.24): the
//! hyper-connections (`hc_count`, `hc_lowrank`), the QSA indexer (`indexer_*`), the hashed
//! n-gram per-layer embeddings (`ple_layer_ids`, …) and the linear-attention output gate.
//!
//! What hsx runs, and what it refuses:
//! - the QSA indexer picks, for each query, the `indexer_budget / indexer_compress_ratio`
//!   best-scoring complete blocks of `indexer_compress_ratio` keys, plus the keys of the
//!   incomplete last block. While a query sees at most `budget + ratio - 1` keys, that is
//!   every key it sees (its complete blocks are no more than the budget's): attention is then
//!   exactly full attention. hsx runs that regime and caps requests at `budget + ratio - 1`
//!   tokens (the engine says why); the sparse selection past it is not built;
//! - `ple_layer_ids` (n-gram embeddings) is refused: not built;
//! - the output gate of the linear-attention norm must be SiLU (`output_gate_type`, else
//!   `hidden_act`); sigmoid is refused.

use serde_json::Value;

use super::ModelError;
use super::config::{Cfg, HyperSpec, ModelSpec, QsaSpec};

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
    if let Some(ids) = cfg.get("ple_layer_ids").and_then(Value::as_array)
        && !ids.is_empty()
    {
        return Err(unsupported(
            cfg,
            "Qwen4-Exp's n-gram per-layer embeddings (`ple_layer_ids`)",
        ));
    }
    let gate = (cfg
        .get("output_gate_type")
        .or_else(|| cfg.get("hidden_act")))
    .and_then(Value::as_str)
    .unwrap_or("silu");
    if gate != "silu" {
        let what = format!("a `{gate}` output gate on the linear-attention norm (only silu)");
        return Err(unsupported(cfg, &what));
    }
    let qsa = qsa(cfg, &spec)?;
    spec.max_position_embeddings = spec.max_position_embeddings.min(qsa.dense_len());
    spec.qsa = Some(qsa);
    Ok(spec)
}

fn unsupported(cfg: &Cfg<'_>, what: &str) -> ModelError {
    ModelError::Unsupported {
        path: cfg.path_buf(),
        what: what.to_string(),
    }
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
    let (heads, kv_heads, head_dim) = (
        field("indexer_n_heads")?,
        field("indexer_kv_heads")?,
        field("indexer_head_dim")?,
    );
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

//! DeepSeek Sparse Attention's indexer in `config.json` (`DeepseekV32Config`,
//! `GlmMoeDsaConfig`) -> [`DsaSpec`]; the rule it runs is in [`crate::kernels::dsa`].

use serde_json::Value;

use super::ModelError;
use super::config::{Architecture, Cfg, shown};

/// The indexer's geometry and which layers run one.
#[derive(Debug, Clone, PartialEq)]
pub struct DsaSpec {
    /// `index_n_heads` (64 DeepSeek-V3.2, 32 GLM-5 by default).
    pub heads: usize,
    /// `index_head_dim` (128).
    pub head_dim: usize,
    /// `index_topk` (2048): a query keeps every key up to this many, its best this many past.
    pub topk: usize,
    /// GLM-5 rotates the indexer's interleaved pairs, DeepSeek-V3.2 its halves.
    pub interleave: bool,
    /// Per layer: runs its own indexer (`"full"`), or reuses the last one's selection
    /// (`"shared"`, GLM-5's `indexer_types`).
    pub own: Vec<bool>,
}

impl DsaSpec {
    /// Layer `i`'s index among the layers that run an indexer, `None` for a shared layer.
    pub fn index_layer(&self, i: usize) -> Option<usize> {
        self.own[i].then(|| self.own[..i].iter().filter(|&&o| o).count())
    }

    /// How many layers run an indexer (the index-key cache's layers).
    pub fn indexer_layers(&self) -> usize {
        self.own.iter().filter(|&&o| o).count()
    }
}

/// The indexer of a family with DeepSeek Sparse Attention (`None` for the others); `rope`
/// is `qk_rope_head_dim`, which it rotates too.
pub(super) fn dsa_spec(
    cfg: &Cfg<'_>,
    architecture: Architecture,
    layers: usize,
    rope: usize,
) -> Result<Option<DsaSpec>, ModelError> {
    let glm = match architecture {
        Architecture::DeepseekV32 => false,
        Architecture::GlmMoeDsa => true,
        _ => return Ok(None),
    };
    let spec = DsaSpec {
        heads: cfg.usize_or("index_n_heads", if glm { 32 } else { 64 })?,
        head_dim: cfg.usize_or("index_head_dim", 128)?,
        topk: cfg.usize_or("index_topk", 2048)?,
        interleave: glm,
        own: match glm {
            true => glm_indexer_types(cfg, layers)?,
            false => vec![true; layers],
        },
    };
    if spec.topk == 0 {
        return Err(cfg.err("index_topk", "must be > 0"));
    }
    if spec.heads == 0 || spec.head_dim < rope {
        let msg = format!(
            "{} heads of {} dims: the indexer needs heads and rotates qk_rope_head_dim ({rope}) \
             of its dims",
            spec.heads, spec.head_dim
        );
        return Err(cfg.err("index_head_dim", msg));
    }
    if spec.own.first() == Some(&false) {
        let msg = "layer 0 is \"shared\": no indexer before it to share";
        return Err(cfg.err("indexer_types", msg));
    }
    Ok(Some(spec))
}

/// GLM-5's `indexer_types` (`"full"` / `"shared"` per layer), else `GlmMoeDsaConfig`'s
/// default from `index_topk_pattern` (`"FSS…"`) or `index_topk_freq` (1) and
/// `index_skip_topk_offset` (2): layer `i` is full when `max(i - offset + 1, 0) % freq == 0`.
fn glm_indexer_types(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let kind = |k: &str| match k {
        "full" => Some(true),
        "shared" => Some(false),
        _ => None,
    };
    if let Some(own) = cfg.per_layer_list("indexer_types", layers, "full / shared", kind)? {
        return Ok(own);
    }
    if let Some(p) = cfg.get("index_topk_pattern").filter(|p| !p.is_null()) {
        let own: Option<Vec<bool>> = match p {
            Value::String(s) => (s.chars())
                .map(|c| match c {
                    'F' => Some(true),
                    'S' => Some(false),
                    _ => None,
                })
                .collect(),
            Value::Array(a) => a.iter().map(|k| k.as_str().and_then(kind)).collect(),
            _ => None,
        };
        return match own {
            Some(own) if own.len() == layers => Ok(own),
            _ => Err(cfg.err(
                "index_topk_pattern",
                format!("expected {layers} letters F / S, got {}", shown(p)),
            )),
        };
    }
    let freq = cfg.usize_or("index_topk_freq", 1)?.max(1);
    let offset = cfg.usize_or("index_skip_topk_offset", 2)?;
    Ok((0..layers)
        .map(|i| (i + 1).saturating_sub(offset).is_multiple_of(freq))
        .collect())
}

#[cfg(test)]
#[path = "dsa_config_tests.rs"]
mod tests;

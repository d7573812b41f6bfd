//! `config.json` of the hybrid families -> [`ModelSpec`] with a [`HybridSpec`].
//!
//! - Qwen3.5 text (`Qwen3_5ForCausalLM`, `model_type` `qwen3_5_text`) and Qwen3-Next
//!   (`Qwen3NextForCausalLM`): `layer_types` (or `full_attention_interval`, default 4: layer i
//!   is full attention iff (i+1) % interval == 0), the `linear_*` Gated DeltaNet fields,
//!   `partial_rotary_factor` (in `rope_parameters` or top level, default 0.25); Qwen3-Next and
//!   Qwen3.5-MoE (`Qwen3_5MoeForCausalLM`) add MoE (`moe_config`).
//! - Nemotron-H (`NemotronHForCausalLM`): `layers_block_type` (alias `layer_types`) or the
//!   legacy `hybrid_override_pattern` (`M` Mamba-2, `*` attention, `-` MLP, `E` MoE), Mamba-2
//!   fields (also under their legacy `mamba_*` names). `{"__float__": "Infinity"}` values (in
//!   `time_step_limit`) are never read as numbers.

use serde_json::Value;

use super::ModelError;
use super::config::{
    Architecture, Cfg, MAX_LAYERS, ModelSpec, QkNorm, RopeScaling, WeightDtype, default_max_pos,
};
pub use super::moe_spec::{DEFAULT_RENORM_EPS, GroupRank, MoeRouter, MoeSpec};
pub use crate::kernels::device::NormGate;

/// What one decoder layer (block) of a hybrid model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Full (softmax) attention over the paged KV cache.
    Attention,
    /// Gated DeltaNet (Qwen3.5 / Qwen3-Next `linear_attention`).
    GatedDeltaNet,
    /// Kimi Delta Attention (Kimi Linear's `linear_attention`): Gated DeltaNet with a decay
    /// per key channel.
    KimiDelta,
    /// Mamba-1 mixer (Mamba, Falcon-Mamba).
    Mamba1,
    /// Mamba-2 mixer (Nemotron-H `linear_attention` / `M`).
    Mamba2,
    /// MLP-only block (Nemotron-H `mlp` / `-`).
    Mlp,
    /// MoE block (Nemotron-H `moe` / `E`, Nemotron 3).
    Moe,
    /// Falcon-H1's layer: a Mamba-2 mixer and attention side by side (both a recurrent-state
    /// layer and a KV cache layer).
    MambaAttention,
    /// LFM2's gated short convolution (`conv`): a conv window is its only state.
    ShortConv,
}

impl LayerKind {
    /// Layers that keep a per-request recurrent state (conv + delta/SSM state).
    pub fn is_recurrent(self) -> bool {
        matches!(
            self,
            Self::GatedDeltaNet
                | Self::KimiDelta
                | Self::Mamba1
                | Self::Mamba2
                | Self::MambaAttention
                | Self::ShortConv
        )
    }

    /// Layers with softmax attention over the KV cache.
    pub fn has_attention(self) -> bool {
        matches!(self, Self::Attention | Self::MambaAttention)
    }
}

/// Gated DeltaNet geometry (Qwen3.5 / Qwen3-Next `linear_*` fields).
#[derive(Debug, Clone, PartialEq)]
pub struct GdnSpec {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    pub conv_kernel: usize,
    /// `beta = beta_scale · sigmoid(b)`: 1, or 2 with OLMo Hybrid's
    /// `linear_allow_neg_eigval`.
    pub beta_scale: f32,
    /// The gated output norm's epsilon where it is not `rms_norm_eps` (OLMo Hybrid: 1e-5).
    pub norm_eps: Option<f64>,
    /// The gate of that norm: `silu(z)`, or Qwen4-Exp's `output_gate_type` `sigmoid`.
    pub out_gate: NormGate,
}

impl GdnSpec {
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.k_head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.v_head_dim
    }
    /// Channels of the causal conv: q, k, v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// Nemotron-H Mamba-2 mixer geometry.
#[derive(Debug, Clone, PartialEq)]
pub struct MambaSpec {
    pub num_heads: usize,
    pub head_dim: usize,
    pub state_size: usize,
    pub n_groups: usize,
    pub conv_kernel: usize,
    /// HF prefill (chunk-scan) lower clamp of `dt` (`time_step_min`).
    pub time_step_min: f64,
    pub conv_bias: bool,
    /// in_proj / out_proj bias (`use_bias`).
    pub proj_bias: bool,
    /// The RMSNorm of the output and its gate.
    pub norm: MambaNorm,
}

/// Where a Mamba-2 mixer's output RMSNorm (over `n_groups` groups, `norm.weight`) sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MambaNorm {
    /// `norm(y · silu(z))` (Nemotron-H, Bamba, Granite 4.0; Falcon-H1's
    /// `mamba_norm_before_gate` false).
    AfterGate,
    /// `norm(y) · silu(z)` (Falcon-H1's `mamba_norm_before_gate` true).
    BeforeGate,
    /// `y · silu(z)`, no norm and no `norm.weight` (Falcon-H1's `mamba_rms_norm` false).
    None,
}

impl MambaSpec {
    pub fn intermediate(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Channels of the causal conv: x, B, C.
    pub fn conv_dim(&self) -> usize {
        self.intermediate() + 2 * self.n_groups * self.state_size
    }
}

/// The hybrid part of a [`ModelSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct HybridSpec {
    /// One entry per layer id 1..=L (block i -> `layers[i]`).
    pub layers: Vec<LayerKind>,
    /// Rotated dims of each attention head (partial rotary); 0 = no RoPE (Nemotron-H).
    pub rotary_dim: usize,
    pub gdn: Option<GdnSpec>,
    pub moe: Option<MoeSpec>,
    pub mamba: Option<MambaSpec>,
    /// Mamba-1's mixers ([`LayerKind::Mamba1`]).
    pub mamba1: Option<super::mamba::Mamba1Spec>,
    /// Nemotron 3's MoE blocks ([`LayerKind::Moe`]).
    pub nemotron_moe: Option<super::nemotron_moe::NemotronMoeSpec>,
    /// DeepSeek-V3's multi-head latent attention in every attention layer.
    pub mla: Option<super::deepseek_config::MlaSpec>,
}

impl HybridSpec {
    /// Layer `i`'s index among the layers of its kind: its KV cache layer (attention) or its
    /// recurrent-state layer (Gated DeltaNet, Kimi Delta Attention, Mamba-2), as the cache is
    /// laid out.
    pub fn index_in_kind(&self, i: usize) -> usize {
        let kind = self.layers[i];
        let same = |k: LayerKind| match kind.is_recurrent() {
            true => k.is_recurrent(),
            false => k == kind,
        };
        self.layers[..i].iter().filter(|&&k| same(k)).count()
    }
}

/// Rotated dims of each attention head: `int(head_dim · partial_rotary_factor)` as transformers
/// computes it, the factor read from `rope_parameters` or the top level (`default` when absent).
pub(super) fn rotary_dim(
    cfg: &Cfg<'_>,
    head_dim: usize,
    default: f64,
) -> Result<usize, ModelError> {
    let factor = cfg
        .get("rope_parameters")
        .and_then(|p| p.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .map(Ok)
        .unwrap_or_else(|| cfg.f64_or("partial_rotary_factor", default))?;
    let rotary_dim = (head_dim as f64 * factor) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
        return Err(cfg.err(
            "partial_rotary_factor",
            format!("{factor} gives rotary dim {rotary_dim} for head_dim {head_dim}"),
        ));
    }
    Ok(rotary_dim)
}

/// Parses a hybrid config (architecture already identified).
pub(super) fn parse(
    cfg: &Cfg<'_>,
    architecture: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    match architecture {
        Architecture::Qwen3_5 | Architecture::Qwen3Next | Architecture::Qwen3_5Moe => {
            parse_qwen(cfg, architecture, name)
        }
        Architecture::Qwen4Exp => {
            super::qwen4_exp_config::parse(cfg, parse_qwen(cfg, architecture, name)?)
        }
        Architecture::NemotronH => parse_nemotron(cfg, name),
        _ => unreachable!("not a hybrid architecture"),
    }
}

fn unsupported(cfg: &Cfg<'_>, what: String) -> ModelError {
    ModelError::Unsupported {
        path: cfg.path_buf(),
        what,
    }
}

fn string_list(cfg: &Cfg<'_>, field: &str) -> Result<Option<Vec<String>>, ModelError> {
    let Some(v) = cfg.get(field) else {
        return Ok(None);
    };
    let arr = v
        .as_array()
        .ok_or_else(|| cfg.err(field, "expected a list of strings"))?;
    arr.iter()
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| cfg.err(field, format!("expected a string, found {x}")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn check_act(
    cfg: &Cfg<'_>,
    field: &str,
    default: &str,
    allowed: &[&str],
) -> Result<(), ModelError> {
    let act = cfg.get(field).and_then(Value::as_str).unwrap_or(default);
    if allowed.contains(&act) {
        Ok(())
    } else {
        Err(unsupported(
            cfg,
            format!("{field} `{act}` (only {})", allowed.join(", ")),
        ))
    }
}

fn no_sliding_window(cfg: &Cfg<'_>) -> Result<(), ModelError> {
    if cfg.usize_opt("sliding_window")?.is_some() || cfg.bool_or("use_sliding_window", false)? {
        return Err(unsupported(
            cfg,
            "sliding-window attention in a hybrid model".into(),
        ));
    }
    Ok(())
}

fn parse_qwen(
    cfg: &Cfg<'_>,
    architecture: Architecture,
    name: String,
) -> Result<ModelSpec, ModelError> {
    check_act(cfg, "hidden_act", "silu", &["silu", "swish"])?;
    no_sliding_window(cfg)?;
    let num_layers = cfg.num_layers()?;
    let types = match architecture {
        Architecture::Qwen4Exp => cfg.qwen4_layer_types(num_layers)?,
        _ => cfg.linear_layer_types(num_layers, LayerKind::GatedDeltaNet)?,
    };
    let layers = match types {
        Some(kinds) => kinds,
        None => {
            let interval = cfg.usize_or("full_attention_interval", 4)?.max(1);
            (0..num_layers)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        LayerKind::Attention
                    } else {
                        LayerKind::GatedDeltaNet
                    }
                })
                .collect()
        }
    };
    let hidden_size = cfg.usize_req("hidden_size")?;
    let num_heads = cfg.usize_req("num_attention_heads")?;
    let head_dim = cfg.usize_or("head_dim", 256)?;
    let (rope_theta, rope_scaling) = cfg.rope(architecture)?;
    // YaRN as the Qwen3-Next / Qwen3.5 model cards give it for long contexts (over the rotated
    // dims, its attention factor on their cos / sin, as transformers); no other scaling.
    if !matches!(rope_scaling, RopeScaling::None | RopeScaling::Yarn { .. }) {
        let msg = "rope scaling other than yarn in a Qwen3-Next / Qwen3.5 model";
        return Err(unsupported(cfg, msg.into()));
    }
    let rotary_dim = rotary_dim(cfg, head_dim, 0.25)?;
    let gdn = GdnSpec {
        num_k_heads: cfg.usize_or("linear_num_key_heads", 16)?,
        num_v_heads: cfg.usize_or("linear_num_value_heads", 32)?,
        k_head_dim: cfg.usize_or("linear_key_head_dim", 128)?,
        v_head_dim: cfg.usize_or("linear_value_head_dim", 128)?,
        conv_kernel: cfg.usize_or("linear_conv_kernel_dim", 4)?,
        beta_scale: 1.0,
        norm_eps: None,
        out_gate: NormGate::Silu,
    };
    let moe = if architecture != Architecture::Qwen3_5 {
        super::moe_config::qwen_moe(cfg, architecture, num_layers)?
    } else {
        if cfg.usize_or("num_experts", 0)? > 0 {
            return Err(unsupported(
                cfg,
                "MoE in a Qwen3_5ForCausalLM config".into(),
            ));
        }
        None
    };
    // Qwen3.5-MoE configs have no dense MLP size (every layer is sparse).
    let intermediate_size = match (&moe, architecture) {
        (Some(m), Architecture::Qwen3_5Moe | Architecture::Qwen4Exp) => {
            cfg.usize_or("intermediate_size", m.expert_intermediate)?
        }
        _ => cfg.usize_req("intermediate_size")?,
    };
    Ok(ModelSpec {
        vocab_size: cfg.usize_req("vocab_size")?,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", num_heads)?,
        head_dim,
        intermediate_size,
        rms_norm_eps: cfg.f64_or("rms_norm_eps", 1e-6)?,
        rope_theta,
        rope_scaling,
        qkv_bias: cfg.bool_or("attention_bias", false)?,
        o_bias: cfg.bool_or("attention_bias", false)?,
        mlp_bias: false,
        qk_norm: QkNorm::PerHead,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg
            .usize_or("max_position_embeddings", default_max_pos(architecture))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers,
            rotary_dim,
            gdn: Some(gdn),
            moe,
            mamba: None,
            nemotron_moe: None,
            mamba1: None,
            mla: None,
        }),
        ..ModelSpec::base(name, architecture)
    })
}

fn nemotron_layers(cfg: &Cfg<'_>) -> Result<Vec<LayerKind>, ModelError> {
    let unsupported_block = |what: &str| {
        unsupported(
            cfg,
            format!(
                "Nemotron-H block `{what}` (supported: Mamba-2 `M`, attention `*`, MLP `-`, MoE `E`)"
            ),
        )
    };
    let list = match string_list(cfg, "layers_block_type")? {
        Some(l) => Some(l),
        None => string_list(cfg, "layer_types")?,
    };
    if let Some(list) = list {
        return list
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" | "mamba" => Ok(LayerKind::Mamba2),
                "full_attention" | "attention" => Ok(LayerKind::Attention),
                "mlp" => Ok(LayerKind::Mlp),
                "moe" => Ok(LayerKind::Moe),
                other => Err(unsupported_block(other)),
            })
            .collect();
    }
    let pattern = cfg
        .get("hybrid_override_pattern")
        .and_then(Value::as_str)
        .ok_or_else(|| cfg.err("layers_block_type", "missing (nor hybrid_override_pattern)"))?;
    pattern
        .chars()
        .map(|c| match c {
            'M' => Ok(LayerKind::Mamba2),
            '*' => Ok(LayerKind::Attention),
            '-' => Ok(LayerKind::Mlp),
            'E' => Ok(LayerKind::Moe),
            other => Err(unsupported_block(&other.to_string())),
        })
        .collect()
}

/// First present of several spellings of one field.
pub(super) fn first_usize(
    cfg: &Cfg<'_>,
    names: &[&str],
    default: usize,
) -> Result<usize, ModelError> {
    for n in names {
        if let Some(v) = cfg.usize_opt(n)? {
            return Ok(v);
        }
    }
    Ok(default)
}

fn parse_nemotron(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    check_act(cfg, "mlp_hidden_act", "relu2", &["relu2"])?;
    check_act(cfg, "mamba_hidden_act", "silu", &["silu", "swish"])?;
    no_sliding_window(cfg)?;
    // MTP layers (`num_nextn_predict_layers`) are not part of the base model's hidden states;
    // their weights are ignored.
    let layers = nemotron_layers(cfg)?;
    if layers.is_empty() || layers.len() > MAX_LAYERS {
        let n = layers.len();
        return Err(cfg.err(
            "layers_block_type",
            format!("{n} blocks (1..={MAX_LAYERS} accepted)"),
        ));
    }
    let hidden_size = cfg.usize_req("hidden_size")?;
    let num_heads = cfg.usize_req("num_attention_heads")?;
    let time_step_min = match cfg.get("time_step_min").or_else(|| cfg.get("mamba_dt_min")) {
        None => 0.001,
        Some(v) => v
            .as_f64()
            .ok_or_else(|| cfg.err("time_step_min", format!("expected a number, found {v}")))?,
    };
    let mamba = MambaSpec {
        num_heads: cfg.usize_or("mamba_num_heads", 128)?,
        head_dim: cfg.usize_or("mamba_head_dim", 64)?,
        state_size: first_usize(cfg, &["ssm_state_size"], 128)?,
        n_groups: first_usize(cfg, &["n_groups", "mamba_n_groups"], 8)?,
        conv_kernel: first_usize(cfg, &["conv_kernel", "mamba_d_conv"], 4)?,
        time_step_min,
        conv_bias: match cfg.get("use_conv_bias") {
            Some(_) => cfg.bool_or("use_conv_bias", true)?,
            None => cfg.bool_or("mamba_conv_bias", true)?,
        },
        proj_bias: cfg.bool_or("use_bias", false)?,
        norm: MambaNorm::AfterGate,
    };
    let nemotron_moe = super::nemotron_moe::parse(cfg, &layers)?;
    Ok(ModelSpec {
        vocab_size: cfg.usize_req("vocab_size")?,
        hidden_size,
        num_layers: layers.len(),
        num_heads,
        num_kv_heads: cfg.usize_or("num_key_value_heads", num_heads)?,
        // NemotronHConfig.head_dim defaults to 128 (not hidden / heads).
        head_dim: cfg.usize_or("head_dim", 128)?,
        intermediate_size: cfg.usize_req("intermediate_size")?,
        rms_norm_eps: cfg.f64_or("layer_norm_epsilon", 1e-5)?,
        // No RoPE in Nemotron-H attention; the value is never used.
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: cfg.bool_or("mlp_bias", false)?,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or(
            "max_position_embeddings",
            default_max_pos(Architecture::NemotronH),
        )?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers,
            rotary_dim: 0,
            gdn: None,
            moe: None,
            mamba: Some(mamba),
            mamba1: None,
            nemotron_moe,
            mla: None,
        }),
        ..ModelSpec::base(name, Architecture::NemotronH)
    })
}

#[cfg(test)]
#[path = "hybrid_config_tests.rs"]
mod tests;

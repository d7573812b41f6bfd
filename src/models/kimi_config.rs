//! `KimiLinearForCausalLM` (Kimi Linear 48B-A3B): `config.json` -> [`ModelSpec`]. DeepSeek-V3's
//! spec ([`super::deepseek_config`]: multi-head latent attention, its MoE) under the names the
//! releases write (`num_experts`, `num_experts_per_token`, `num_shared_experts`,
//! `moe_renormalize`, `num_expert_group`, `model_max_length`: transformers' `attribute_map`),
//! with `KimiLinearConfig`'s defaults, then the layer kinds: `layer_types`, else the releases'
//! 1-based `linear_attn_config.{kda_layers, full_attn_layers}`, else every 4th layer (from 4)
//! full; Kimi Delta Attention's geometry from `linear_attn_config` (`head_dim`, `num_heads`,
//! `short_conv_kernel_size`) or transformers' `linear_*` fields. The attention runs without
//! RoPE (transformers ignores any RoPE fields: they are dropped here). What the releases of
//! later models name that `KimiLinearForCausalLM` would silently skip is refused.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::config::{Architecture, Cfg, ModelSpec};
use super::hybrid_config::{GdnSpec, LayerKind, NormGate};
use super::{ModelError, deepseek_config};

/// Kimi's field names -> the DeepSeek-V3 names [`deepseek_config`] reads.
const RENAMES: [(&str, &str); 7] = [
    ("num_experts", "n_routed_experts"),
    ("num_local_experts", "n_routed_experts"),
    ("num_experts_per_token", "num_experts_per_tok"),
    ("num_shared_experts", "n_shared_experts"),
    ("moe_renormalize", "norm_topk_prob"),
    ("num_expert_group", "n_group"),
    ("model_max_length", "max_position_embeddings"),
];

/// A Kimi Linear `config.json` under DeepSeek-V3's field names, without RoPE fields (other
/// architectures' untouched).
pub(super) fn as_deepseek(value: Cow<'_, Value>, arch: Architecture) -> Cow<'_, Value> {
    if arch != Architecture::KimiLinear || !value.is_object() {
        return value;
    }
    let mut value = value.into_owned();
    if let Some(map) = value.as_object_mut() {
        for (from, to) in RENAMES {
            if let Some(v) = map.remove(from).filter(|_| !map.contains_key(to)) {
                map.insert(to.into(), v);
            }
        }
        for rope in [
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "partial_rotary_factor",
        ] {
            map.remove(rope);
        }
    }
    Cow::Owned(value)
}

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    refuse_unimplemented(cfg)?;
    let mut spec = deepseek_config::parse(cfg, Architecture::KimiLinear, name)?;
    let linear = cfg.get("linear_attn_config").and_then(Value::as_object);
    let kinds = layer_kinds(cfg, linear, spec.num_layers)?;
    let geometry = |key: &str, field: &str, default: usize| match linear.and_then(|l| l.get(key)) {
        Some(v) => (v.as_u64().and_then(|n| usize::try_from(n).ok()))
            .ok_or_else(|| cfg.err(&format!("linear_attn_config.{key}"), format!("{v}"))),
        None => cfg.usize_or(field, default),
    };
    let heads = geometry("num_heads", "linear_num_heads", 32)?;
    let head_dim = geometry("head_dim", "linear_head_dim", 128)?;
    let gdn = GdnSpec {
        num_k_heads: heads,
        num_v_heads: heads,
        k_head_dim: head_dim,
        v_head_dim: head_dim,
        conv_kernel: geometry("short_conv_kernel_size", "linear_conv_kernel_dim", 4)?,
        beta_scale: 1.0,
        norm_eps: None,
        // Kimi Delta Attention always gates with sigmoid (its layer, `layers/kda.rs`).
        out_gate: NormGate::Sigmoid,
    };
    let hybrid = spec
        .hybrid
        .as_mut()
        .ok_or_else(|| cfg.err("num_hidden_layers", "no layers"))?;
    hybrid.layers = kinds;
    hybrid.gdn = Some(gdn);
    Ok(spec)
}

/// Per layer: `layer_types`, else `linear_attn_config`'s 1-based lists (every layer in
/// exactly one), else `KimiLinearConfig`'s default (layers 4, 8, … full).
fn layer_kinds(
    cfg: &Cfg<'_>,
    linear: Option<&Map<String, Value>>,
    layers: usize,
) -> Result<Vec<LayerKind>, ModelError> {
    if let Some(kinds) = cfg.linear_layer_types(layers, LayerKind::KimiDelta)? {
        return Ok(kinds);
    }
    let lists = linear.and_then(|l| Some((l.get("kda_layers")?, l.get("full_attn_layers")?)));
    let Some((kda, full)) = lists else {
        return Ok((0..layers)
            .map(|i| match i > 0 && i.is_multiple_of(4) {
                true => LayerKind::Attention,
                false => LayerKind::KimiDelta,
            })
            .collect());
    };
    let mut kinds = vec![None; layers];
    for (list, kind) in [(kda, LayerKind::KimiDelta), (full, LayerKind::Attention)] {
        for id in list.as_array().into_iter().flatten() {
            let slot = (id.as_u64())
                .and_then(|n| usize::try_from(n).ok())
                .and_then(|n| n.checked_sub(1))
                .and_then(|i| kinds.get_mut(i))
                .filter(|k| k.is_none());
            *slot.ok_or_else(|| bad_lists(cfg, format!("layer {id} out of range or twice")))? =
                Some(kind);
        }
    }
    kinds
        .iter()
        .enumerate()
        .map(|(i, k)| k.ok_or_else(|| bad_lists(cfg, format!("layer {} in neither list", i + 1))))
        .collect()
}

fn bad_lists(cfg: &Cfg<'_>, why: String) -> ModelError {
    cfg.err("linear_attn_config.kda_layers / full_attn_layers", why)
}

/// Fields of later Kimi releases (and of the originals' remote code) that change the model
/// where `KimiLinearForCausalLM` ignores them: refused rather than run as something else.
fn refuse_unimplemented(cfg: &Cfg<'_>) -> Result<(), ModelError> {
    let linear = |key: &str| {
        cfg.get("linear_attn_config")
            .and_then(|l| l.get(key))
            .cloned()
    };
    let is = |v: Option<Value>, want: &Value| v.is_some_and(|v| &v == want);
    let checks = [
        (
            "mla_use_nope",
            is(cfg.get("mla_use_nope").cloned(), &Value::Bool(false)),
        ),
        (
            "mla_use_output_gate",
            is(cfg.get("mla_use_output_gate").cloned(), &Value::Bool(true)),
        ),
        (
            "attn_res_block_size",
            cfg.get("attn_res_block_size").is_some(),
        ),
        (
            "moe_router_activation_func",
            cfg.get("moe_router_activation_func")
                .is_some_and(|v| v != "sigmoid"),
        ),
        (
            "moe_layer_freq",
            cfg.get("moe_layer_freq").is_some_and(|v| v != 1),
        ),
        (
            "linear_attn_config.use_full_rank_gate",
            is(linear("use_full_rank_gate"), &Value::Bool(true)),
        ),
        (
            "linear_attn_config.gate_lower_bound",
            linear("gate_lower_bound").is_some_and(|v| !v.is_null()),
        ),
    ];
    match checks.iter().find(|(_, refused)| *refused) {
        Some((field, _)) => Err(ModelError::Unsupported {
            path: cfg.path_buf(),
            what: format!(
                "`{field}` as this config sets it (transformers' KimiLinearForCausalLM does not \
                 implement it)"
            ),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::*;
    use crate::models::RopeScaling;
    use crate::models::hybrid_config::{DEFAULT_RENORM_EPS, GroupRank, MoeRouter};

    fn spec(v: Value) -> Result<ModelSpec, ModelError> {
        ModelSpec::from_json(&v, Path::new("c.json"), "m".into())
    }

    /// Kimi-Linear-48B-A3B's shape in the releases' field names (written here from the model
    /// card's numbers, not copied from the file): MLA every 4th layer and the last, KDA the
    /// others, layer 1 dense.
    fn released(extra: Value) -> Value {
        let full = [4, 8, 12, 16, 20, 24, 27];
        let kda: Vec<usize> = (1..=27).filter(|i| !full.contains(i)).collect();
        let mut v = json!({"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
            "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
            "moe_intermediate_size": 1024, "num_hidden_layers": 27, "num_attention_heads": 32,
            "num_key_value_heads": 32, "kv_lora_rank": 512, "q_lora_rank": null,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "mla_use_nope": true, "num_experts": 256, "num_experts_per_token": 8,
            "num_shared_experts": 1, "moe_renormalize": true, "moe_router_activation_func":
            "sigmoid", "routed_scaling_factor": 2.446, "num_expert_group": 1, "topk_group": 1,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "model_max_length": 1048576,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
            "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                "kda_layers": kda, "full_attn_layers": full}});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn released_fields_read_under_their_names() {
        let s = spec(released(json!({}))).unwrap();
        let h = s.hybrid.clone().unwrap();
        let full: Vec<usize> = (0..27)
            .filter(|&i| h.layers[i] == LayerKind::Attention)
            .collect();
        assert_eq!(full, [3, 7, 11, 15, 19, 23, 26]);
        assert!(
            h.layers
                .iter()
                .all(|&k| k == LayerKind::Attention || k == LayerKind::KimiDelta)
        );
        let g = h.gdn.unwrap();
        assert_eq!(
            (g.num_k_heads, g.num_v_heads, g.k_head_dim, g.v_head_dim),
            (32, 32, 128, 128)
        );
        assert_eq!((g.conv_kernel, g.beta_scale, g.norm_eps), (4, 1.0, None));
        let m = h.moe.unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (256, 8, 1024)
        );
        assert_eq!(
            (m.shared_intermediate, m.norm_topk_prob),
            (Some(1024), true)
        );
        assert_eq!(m.sparse_layers.iter().position(|&s| s), Some(1));
        let grouped = MoeRouter::Grouped {
            n_group: 1,
            topk_group: 1,
            scale: 2.446,
            softmax: false,
            bias: true,
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        };
        assert_eq!(m.router, grouped);
        let mla = h.mla.unwrap();
        assert_eq!(
            (mla.q_lora, mla.kv_lora, mla.score_factor),
            (None, 512, 1.0)
        );
        assert_eq!((s.max_position_embeddings, s.rms_norm_eps), (1048576, 1e-5));
        assert!(s.has_recurrent_layers());
    }

    /// transformers' own saves (`layer_types`, `mlp_layer_types`, `linear_*`), and
    /// `KimiLinearConfig`'s defaults where neither names the kinds; RoPE fields ignored (the
    /// attention has none: no YaRN score factor either).
    #[test]
    fn transformers_fields_defaults_and_no_rope() {
        let mut v = released(json!({"linear_head_dim": 64, "linear_num_heads": 8,
            "mlp_layer_types": vec!["dense"; 27],
            "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096}}));
        v.as_object_mut().unwrap().remove("linear_attn_config");
        let s = spec(v.clone()).unwrap();
        let h = s.hybrid.clone().unwrap();
        let full: Vec<usize> = (0..27)
            .filter(|&i| h.layers[i] == LayerKind::Attention)
            .collect();
        assert_eq!(full, [4, 8, 12, 16, 20, 24]);
        assert_eq!(h.gdn.unwrap().k_head_dim, 64);
        assert!(h.moe.unwrap().sparse_layers.iter().all(|&s| !s));
        assert_eq!(
            (s.rope_scaling, h.mla.unwrap().score_factor),
            (RopeScaling::None, 1.0)
        );
        let mut kinds = vec!["linear_attention"; 27];
        kinds[0] = "full_attention";
        v["layer_types"] = json!(kinds);
        assert_eq!(
            spec(v).unwrap().hybrid.unwrap().layers[0],
            LayerKind::Attention
        );
    }

    #[test]
    fn bad_layer_lists_refused() {
        let lists = |kda: Value, full: Value| {
            let c = json!({"head_dim": 128, "num_heads": 32, "kda_layers": kda,
                "full_attn_layers": full});
            spec(released(json!({"linear_attn_config": c})))
                .unwrap_err()
                .to_string()
        };
        let kda: Vec<usize> = (1..=26).collect();
        assert!(lists(json!(kda), json!([])).contains("layer 27 in neither list"));
        assert!(lists(json!(kda), json!([27, 27])).contains("twice"));
        assert!(lists(json!(kda), json!([27, 28])).contains("out of range"));
        assert!(lists(json!(kda), json!([0])).contains("out of range"));
    }

    /// What later Kimi releases set that transformers' class would skip.
    #[test]
    fn unimplemented_fields_refused_by_name() {
        let cases = [
            json!({"mla_use_nope": false}),
            json!({"mla_use_output_gate": true}),
            json!({"attn_res_block_size": 12}),
            json!({"moe_router_activation_func": "softmax"}),
            json!({"moe_layer_freq": 2}),
        ];
        for extra in cases {
            let field = extra.as_object().unwrap().keys().next().unwrap().clone();
            let e = spec(released(extra)).unwrap_err().to_string();
            assert!(e.contains(&field), "{field}: {e}");
        }
        for (key, value) in [
            ("use_full_rank_gate", json!(true)),
            ("gate_lower_bound", json!(-5.0)),
        ] {
            let mut v = released(json!({}));
            v["linear_attn_config"][key] = value;
            let e = spec(v).unwrap_err().to_string();
            assert!(e.contains(key), "{key}: {e}");
        }
    }
}

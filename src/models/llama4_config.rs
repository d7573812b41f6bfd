//! Llama-4's text config (`Llama4TextConfig`, `llama4_text`: `Llama4ForCausalLM` and the
//! language model of `Llama4ForConditionalGeneration` exports) beyond a dense config's fields:
//! which layers rotate (`no_rope_layers`), chunk their keys (`layer_types`,
//! `attention_chunk_size`) and norm q / k (`use_qk_norm`), the NoPE layers' query temperature,
//! and the experts (`moe_layers` or `interleave_moe_layer_step`, top-k of the router's logits
//! with their sigmoid scaling each expert's input, a shared expert as wide as one). Defaults
//! are the class's; a list that contradicts the layer count is refused.

use serde_json::Value;

use super::ModelError;
use super::config::Cfg;
use super::hybrid_config::{MoeRouter, MoeSpec};
use crate::kernels::device::QueryTemperature;
#[cfg(test)]
use crate::kernels::routing::RouterScore;

/// Llama-4's per-layer attention.
#[derive(Debug, Clone, PartialEq)]
pub struct Llama4Spec {
    /// Per layer: RoPE (`no_rope_layers` 1), else NoPE.
    pub rope_layers: Vec<bool>,
    /// The RoPE layers norm q and k per head without a weight (`use_qk_norm`: transformers'
    /// `Llama4TextL2Norm`, an RMSNorm with `rms_norm_eps`).
    pub qk_norm: bool,
    /// Per layer: the chunk of its chunked attention (`layer_types` `chunked_attention`).
    pub chunks: Vec<Option<usize>>,
    /// The NoPE layers' query temperature (`attn_temperature_tuning`).
    pub temperature: Option<QueryTemperature>,
}

/// The attention part of a Llama-4 config of `layers` layers.
pub(super) fn attention(cfg: &Cfg<'_>, layers: usize) -> Result<Llama4Spec, ModelError> {
    let rope_layers = rope_layers(cfg, layers)?;
    let chunk = cfg.usize_opt("attention_chunk_size")?;
    if chunk == Some(0) {
        return Err(cfg.err("attention_chunk_size", "must be at least 1"));
    }
    let chunks = match cfg.get("layer_types") {
        // transformers: chunked where the layer rotates and a chunk size is set.
        None => rope_layers.iter().map(|&r| chunk.filter(|_| r)).collect(),
        Some(v) => layer_chunks(cfg, v, layers, chunk)?,
    };
    Ok(Llama4Spec {
        rope_layers,
        qk_norm: cfg.bool_or("use_qk_norm", true)?,
        chunks,
        temperature: temperature(cfg)?,
    })
}

/// `no_rope_layers` (1: RoPE; at least one entry per layer), or, absent or empty as in
/// Llama-4 Scout's release, every `no_rope_layer_interval`-th layer NoPE.
fn rope_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let field = "no_rope_layers";
    let listed = match cfg.get(field) {
        None => Vec::new(),
        Some(v) => (v.as_array())
            .ok_or_else(|| cfg.err(field, "expected a list of 0 / 1"))?
            .iter()
            .map(|x| truthy(x).ok_or_else(|| cfg.err(field, format!("entry {x} is not 0 / 1"))))
            .collect::<Result<Vec<_>, _>>()?,
    };
    if listed.is_empty() {
        let interval = cfg.usize_or("no_rope_layer_interval", 4)?;
        if interval == 0 {
            return Err(cfg.err("no_rope_layer_interval", "must be at least 1"));
        }
        return Ok((0..layers)
            .map(|i| !(i + 1).is_multiple_of(interval))
            .collect());
    }
    if listed.len() < layers {
        return Err(cfg.err(
            field,
            format!("{} entries for {layers} layers", listed.len()),
        ));
    }
    Ok(listed[..layers].to_vec())
}

/// `layer_types`: one `full_attention` / `chunked_attention` per layer.
fn layer_chunks(
    cfg: &Cfg<'_>,
    v: &Value,
    layers: usize,
    chunk: Option<usize>,
) -> Result<Vec<Option<usize>>, ModelError> {
    let field = "layer_types";
    let kinds = v
        .as_array()
        .filter(|a| a.len() == layers)
        .ok_or_else(|| cfg.err(field, format!("expected a list of {layers} layer types")))?;
    kinds
        .iter()
        .map(|k| match k.as_str() {
            Some("full_attention") => Ok(None),
            Some("chunked_attention") => chunk
                .map(Some)
                .ok_or_else(|| cfg.err(field, "chunked_attention without attention_chunk_size")),
            _ => Err(cfg.err(field, format!("layer type {k} (full / chunked_attention)"))),
        })
        .collect()
}

/// `attn_temperature_tuning` (true, or as released a number: Python's truth of it) with
/// `floor_scale` and `attn_scale`.
fn temperature(cfg: &Cfg<'_>) -> Result<Option<QueryTemperature>, ModelError> {
    let field = "attn_temperature_tuning";
    let on = match cfg.get(field) {
        None => true,
        Some(v) => truthy(v).ok_or_else(|| cfg.err(field, format!("{v} is not a flag")))?,
    };
    if !on {
        return Ok(None);
    }
    let floor_scale = cfg.f64_or("floor_scale", 8192.0)?;
    if !(floor_scale >= 1.0 && floor_scale.is_finite()) {
        return Err(cfg.err("floor_scale", format!("{floor_scale} (at least 1)")));
    }
    let attn_scale = cfg.f64_or("attn_scale", 0.1)?;
    Ok(Some(QueryTemperature {
        floor_scale: floor_scale as f32,
        attn_scale: attn_scale as f32,
        offset: 1.0,
    }))
}

/// A boolean, or a number read as Python reads it in a condition (non-zero: true).
fn truthy(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => n.as_f64().map(|x| x != 0.0),
        _ => None,
    }
}

/// Llama-4's experts: `num_local_experts` (16) experts of `intermediate_size` (8192), top
/// `num_experts_per_tok` (1), a shared expert as wide, in the layers `moe_layers` lists or else
/// every `interleave_moe_layer_step`-th (1: all).
pub(super) fn llama4_moe(cfg: &Cfg<'_>, layers: usize) -> Result<MoeSpec, ModelError> {
    let experts = cfg.usize_or("num_local_experts", 16)?;
    let top_k = cfg.usize_or("num_experts_per_tok", 1)?;
    if experts < 2 || top_k == 0 || top_k > experts {
        return Err(cfg.err(
            "num_experts_per_tok",
            format!("top-{top_k} of {experts} experts"),
        ));
    }
    let inter = cfg.usize_or("intermediate_size", 8192)?;
    Ok(MoeSpec {
        num_experts: experts,
        top_k,
        expert_intermediate: inter,
        shared_intermediate: Some(inter),
        norm_topk_prob: false,
        sparse_layers: sparse_layers(cfg, layers)?,
        router: MoeRouter::Llama4,
    })
}

fn sparse_layers(cfg: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let Some(listed) = cfg.get("moe_layers") else {
        let step = cfg.usize_or("interleave_moe_layer_step", 1)?;
        if step == 0 {
            return Err(cfg.err("interleave_moe_layer_step", "must be at least 1"));
        }
        return Ok((0..layers).map(|i| (i + 1).is_multiple_of(step)).collect());
    };
    let mut sparse = vec![false; layers];
    let bad = || {
        cfg.err(
            "moe_layers",
            format!("expected layer indices below {layers}"),
        )
    };
    for i in listed.as_array().ok_or_else(bad)? {
        let i = i.as_u64().map(|i| i as usize).filter(|&i| i < layers);
        sparse[i.ok_or_else(bad)?] = true;
    }
    Ok(sparse)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec, released_config};
    use super::*;

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// Llama-4 Scout as released (tests/fixtures/released_configs): an export whose text config
    /// is read.
    fn scout() -> Value {
        released_config("llama-4-scout-17b-16e.json")
    }

    fn llama4(s: &ModelSpec) -> &Llama4Spec {
        s.llama4.as_ref().unwrap()
    }

    /// Scout's layers: its empty `no_rope_layers` gives every 4th layer NoPE; the RoPE layers
    /// chunked (8192) with q/k norm; the temperature on; 16 experts top-1 in every layer.
    #[test]
    fn scout_as_released() {
        let s = parse(&scout()).unwrap();
        assert_eq!(s.architecture, Architecture::Llama4);
        assert_eq!((s.num_layers, s.num_heads, s.num_kv_heads), (48, 40, 8));
        assert_eq!(
            (s.head_dim, s.intermediate_size, s.rope_theta),
            (128, 16384, 5e5)
        );
        assert!(!s.tie_word_embeddings && !s.qkv_bias && !s.o_bias);
        let l4 = llama4(&s);
        let rope: Vec<bool> = (0..48).map(|i| i % 4 != 3).collect();
        assert_eq!(l4.rope_layers, rope);
        let chunks: Vec<Option<usize>> = rope.iter().map(|&r| r.then_some(8192)).collect();
        assert_eq!(l4.chunks, chunks);
        assert!(l4.qk_norm);
        let warm = QueryTemperature {
            floor_scale: 8192.0,
            attn_scale: 0.1,
            offset: 1.0,
        };
        assert_eq!(l4.temperature, Some(warm));
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (16, 1, 8192)
        );
        assert_eq!(m.shared_intermediate, Some(8192));
        assert!(m.sparse_layers.iter().all(|&s| s) && m.router == MoeRouter::Llama4);
        let g = m.grouped().unwrap();
        assert!(g.score == RouterScore::SigmoidByLogit && !g.renorm && g.n_group == 1);
    }

    /// The text config's own fields as a fine-tune saves them (Maverick's interleaving, the
    /// lists written out, `attn_temperature_tuning` a number as Meta's configs have it).
    #[test]
    fn lists_flags_and_defaults() {
        let text = |edit: &dyn Fn(&mut Value)| {
            let mut v = scout()["text_config"].clone();
            v["architectures"] = json!(["Llama4ForCausalLM"]);
            edit(&mut v);
            parse(&v)
        };
        let s = text(&|v| {
            v["interleave_moe_layer_step"] = json!(2);
            v["no_rope_layers"] = json!([1, 0, 1, 1].repeat(12));
            v["attn_temperature_tuning"] = json!(4);
            v["use_qk_norm"] = json!(false);
        })
        .unwrap();
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        let odd: Vec<bool> = (0..48).map(|i| i % 2 == 1).collect();
        assert_eq!(m.sparse_layers, odd);
        let l4 = llama4(&s);
        assert_eq!(&l4.rope_layers[..4], &[true, false, true, true]);
        assert_eq!(&l4.chunks[..2], &[Some(8192), None]);
        assert!(l4.temperature.is_some() && !l4.qk_norm);
        let s = text(&|v| {
            v["moe_layers"] = json!([0, 47]);
            v["layer_types"] = json!(vec!["full_attention"; 48]);
            v["attn_temperature_tuning"] = json!(false);
            v["attention_chunk_size"] = Value::Null;
        })
        .unwrap();
        let m = s.hybrid.as_ref().unwrap().moe.as_ref().unwrap();
        assert_eq!(m.sparse_layers.iter().filter(|&&s| s).count(), 2);
        assert!(m.sparse_layers[0] && m.sparse_layers[47]);
        let l4 = llama4(&s);
        assert!(l4.chunks.iter().all(Option::is_none) && l4.temperature.is_none());
        // The class's defaults where a field is absent.
        let s = text(&|v| {
            let o = v.as_object_mut().unwrap();
            for k in [
                "head_dim",
                "rope_theta",
                "rope_scaling",
                "intermediate_size_mlp",
            ] {
                o.remove(k);
            }
            for k in [
                "num_local_experts",
                "num_experts_per_tok",
                "intermediate_size",
            ] {
                o.remove(k);
            }
            o.remove("no_rope_layers");
            o.insert("no_rope_layer_interval".into(), json!(3));
        })
        .unwrap();
        assert_eq!(
            (s.head_dim, s.rope_theta, s.intermediate_size),
            (128, 5e5, 16384)
        );
        assert_eq!(&llama4(&s).rope_layers[..3], &[true, true, false]);
        let m = s.hybrid.unwrap().moe.unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate),
            (16, 1, 8192)
        );
    }

    /// A list that does not fit the layers, a zero size, a value of the wrong kind: refused,
    /// naming the field.
    #[test]
    fn contradictions_are_refused_by_name() {
        let cases = [
            ("no_rope_layers", json!([1, 1, 0])),
            ("no_rope_layers", json!(vec!["yes"; 48])),
            ("no_rope_layer_interval", json!(0)),
            ("layer_types", json!(vec!["full_attention"; 47])),
            ("layer_types", json!(vec!["sliding_attention"; 48])),
            ("moe_layers", json!([48])),
            ("moe_layers", json!("all")),
            ("interleave_moe_layer_step", json!(0)),
            ("attention_chunk_size", json!(0)),
            ("floor_scale", json!(0)),
            ("attn_temperature_tuning", json!("on")),
            ("num_experts_per_tok", json!(17)),
        ];
        for (field, value) in cases {
            let mut v = scout();
            v["text_config"][field] = value.clone();
            if field == "no_rope_layer_interval" {
                v["text_config"]["no_rope_layers"] = Value::Null;
            }
            let e = parse(&v).unwrap_err();
            assert!(e.contains(field), "{field} {value}: {e}");
        }
        let mut v = scout();
        v["text_config"]["layer_types"] = json!(vec!["chunked_attention"; 48]);
        v["text_config"]["attention_chunk_size"] = Value::Null;
        assert!(parse(&v).unwrap_err().contains("layer_types"));
    }
}

//! OLMo 1 (`OlmoForCausalLM`: OLMo-1B-hf, OLMo-7B-hf, OLMo-7B-0424-hf / 0724; `model.*`
//! names as Llama's). Llama's pre-norm layers and SwiGLU MLP, but every LayerNorm (the two of
//! each layer and the final one) is `F.layer_norm` without weight or bias, eps 1e-5 fixed
//! (`OlmoLayerNorm`: the config has no eps); where the config's `clip_qkv` is set, q, k and v
//! are clamped to `±clip_qkv` right after their projections, before RoPE (OLMo-7B-0424's 8).

use super::config::{Architecture, Cfg};
use super::decoder::Decoder;
use super::dense::{load_attention, load_mlp, pre_norm_layer};
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::NormKind;

/// `OlmoLayerNorm`'s eps (a constant in transformers' module).
const EPS: f64 = 1e-5;

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::Olmo, name)?;
    spec.norm = NormKind::Layer;
    spec.rms_norm_eps = EPS;
    spec.clip_qkv = clip_qkv(cfg)?;
    Ok(spec)
}

/// `clip_qkv`: absent or null for none, else a positive finite limit.
fn clip_qkv(cfg: &Cfg<'_>) -> Result<Option<f32>, ModelError> {
    if cfg.get("clip_qkv").is_none() {
        return Ok(None);
    }
    let limit = cfg.f64_or("clip_qkv", 0.0)?;
    if !(limit.is_finite() && limit > 0.0) {
        return Err(cfg.err(
            "clip_qkv",
            format!("must be a positive number, found {limit}"),
        ));
    }
    Ok(Some(limit as f32))
}

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let final_norm = unit_norm(ld, &spec)?;
    super::dense::load_around(ld, spec, (vocab, final_norm), load_layer)
}

/// The weights of a LayerNorm without any: ones (times 1 is exact, so the norm's bits are
/// those of `F.layer_norm(x, shape, None, None)`).
fn unit_norm<D: Device>(ld: &Loader<'_, D>, spec: &ModelSpec) -> Result<D::Vector, ModelError> {
    Ok(ld.dev.vector(&vec![1.0; spec.hidden_size])?)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let attention = load_attention(ld, spec, i, SoftmaxVariant::causal())?;
    let mlp = load_mlp(
        ld,
        spec,
        &format!("model.layers.{i}.mlp"),
        Activation::SwiGlu,
    )?;
    let norms = [unit_norm(ld, spec)?, unit_norm(ld, spec)?];
    Ok(pre_norm_layer(
        norms,
        Sublayer::Attention(attention),
        Sublayer::Mlp(mlp),
    ))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::{Architecture, ModelSpec};
    use crate::kernels::device::NormKind;

    fn parse(v: &Value) -> Result<ModelSpec, String> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into()).map_err(|e| e.to_string())
    }

    /// Shaped as OLMo-7B-0424-hf's config: LayerNorms of eps 1e-5 (the config has none),
    /// `clip_qkv` 8; OLMo-1B-hf's null `clip_qkv` clamps nothing; a limit that is not a
    /// positive number is refused by name.
    #[test]
    fn olmo_7b_0424_clip_qkv_and_weightless_norms() {
        let mut v = json!({
            "architectures": ["OlmoForCausalLM"], "model_type": "olmo", "hidden_act": "silu",
            "attention_bias": false, "clip_qkv": 8.0, "hidden_size": 4096,
            "intermediate_size": 11008, "max_position_embeddings": 4096,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "rope_theta": 10000.0, "tie_word_embeddings": false, "vocab_size": 50304
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Olmo);
        assert_eq!(
            (s.norm, s.rms_norm_eps, s.clip_qkv),
            (NormKind::Layer, 1e-5, Some(8.0))
        );
        assert_eq!((s.head_dim, s.num_kv_heads, s.qkv_bias), (128, 32, false));
        v["clip_qkv"] = json!(null);
        assert_eq!(parse(&v).unwrap().clip_qkv, None);
        for bad in [json!(0.0), json!(-8.0), json!("8")] {
            v["clip_qkv"] = bad.clone();
            assert!(parse(&v).unwrap_err().contains("clip_qkv"), "{bad}");
        }
    }
}

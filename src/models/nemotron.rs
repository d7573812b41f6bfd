//! Nemotron (`NemotronForCausalLM`: Nemotron-4 Minitron 4B / 8B, Nemotron-Mini-4B,
//! Llama-3.1-Minitron-4B; `model.*` names as Llama's). Llama's pre-norm layers, but each norm
//! (the two of a layer and `model.norm`) is a `LayerNorm1P`: an `nn.LayerNorm` with a bias
//! whose weight is applied as `1 + weight` (in f32, as transformers run in f32 adds it to a
//! bf16 checkpoint's widened weight), of `norm_eps` (1e-5); RoPE on the first
//! `partial_rotary_factor` (½) of each head; the MLP `down(relu²(up(x)))` without a gate;
//! biases where `attention_bias` / `mlp_bias`.

use super::config::{Architecture, Cfg};
use super::decoder::Decoder;
use super::dense::{load_attention, load_mlp, pre_norm_layer};
use super::layers::mlp::Activation;
use super::layers::{Layer, Loader, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::NormKind;

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::Nemotron, name)?;
    spec.norm = NormKind::LayerBias;
    spec.rms_norm_eps = cfg.f64_or("norm_eps", 1e-5)?;
    spec.rotary_dim = Some(super::hybrid_config::rotary_dim(cfg, spec.head_dim, 0.5)?);
    Ok(spec)
}

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let final_norm = layer_norm_1p(ld, "model.norm", spec.hidden_size)?;
    super::dense::load_around(ld, spec, (vocab, final_norm), load_layer)
}

/// The `LayerNorm1P` `name` as [`NormKind::LayerBias`] takes it: `[1 + weight | bias]`.
fn layer_norm_1p<D: Device>(
    ld: &Loader<'_, D>,
    name: &str,
    n: usize,
) -> Result<D::Vector, ModelError> {
    let mut w = ld.f32s(&format!("{name}.weight"), &[n])?;
    w.iter_mut().for_each(|v| *v += 1.0);
    w.extend(ld.f32s(&format!("{name}.bias"), &[n])?);
    Ok(ld.dev.vector(&w)?)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let h = spec.hidden_size;
    let attention = load_attention(ld, spec, i, SoftmaxVariant::causal())?;
    let mlp = load_mlp(ld, spec, &format!("{p}.mlp"), Activation::Relu2)?;
    let norm = |n: &str| layer_norm_1p(ld, &format!("{p}.{n}"), h);
    let norms = [norm("input_layernorm")?, norm("post_attention_layernorm")?];
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

    /// Shaped as Minitron-8B-Base's config: 48 heads of 128 over a hidden of 4096, 8 KV
    /// heads, half of each head rotated, LayerNorm1P of `norm_eps`, relu² (another
    /// activation refused by name).
    #[test]
    fn minitron_8b_partial_rotary_layer_norm_1p() {
        let mut v = json!({
            "architectures": ["NemotronForCausalLM"], "model_type": "nemotron",
            "hidden_act": "relu2", "hidden_size": 4096, "head_dim": 128,
            "intermediate_size": 16384, "max_position_embeddings": 4096, "norm_eps": 1e-5,
            "num_attention_heads": 48, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "partial_rotary_factor": 0.5, "rope_theta": 10000, "tie_word_embeddings": false,
            "vocab_size": 256000
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::Nemotron);
        assert_eq!((s.head_dim, s.rotated_dims(), s.num_kv_heads), (128, 64, 8));
        assert_eq!((s.norm, s.rms_norm_eps), (NormKind::LayerBias, 1e-5));
        assert!(!s.qkv_bias && !s.o_bias && !s.mlp_bias);
        v["hidden_act"] = json!("silu");
        assert!(parse(&v).unwrap_err().contains("hidden_act `silu`"));
    }
}

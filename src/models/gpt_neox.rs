//! GPT-NeoX (`GPTNeoXForCausalLM`: Pythia 14M–12B, GPT-NeoX-20B, and the models built on it;
//! `gpt_neox.*` names). Per layer `input_layernorm` and `post_attention_layernorm` (LayerNorms
//! with biases, `layer_norm_eps`); with `use_parallel_residual` (the default)
//! `x += attention(ln1(x)) + mlp(ln2(x))`, else Llama's two steps. The attention's fused
//! `query_key_value` holds each head's q, k and v rows together (`[heads, 3, head_dim]`), RoPE
//! on the first `rotary_pct` of each head (¼ by default; transformers 5 writes it as
//! `rope_parameters.partial_rotary_factor`, and `rotary_emb_base` as its `rope_theta`),
//! biased where `attention_bias` (the default); the MLP `dense_4h_to_h(act(dense_h_to_4h(x)))`
//! biased, `act` the exact GELU (`gelu`, the default) or the tanh one (`gelu_new`,
//! `gelu_pytorch_tanh`). Then `gpt_neox.final_layer_norm` and the head `embed_out`.

use super::config::{Architecture, Cfg};
use super::decoder::Vocab;
use super::dense::{pre_norm_layer, ungated_mlp};
use super::layers::mlp::Activation;
use super::layers::{Attention, Layer, Loader, ParallelNormed, Part, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::NormKind;
use crate::kernels::rope::Rope;

/// `GPTNeoXConfig`'s `hidden_act` values hsx runs, and the activation each is.
const ACTIVATIONS: [(&str, Activation); 3] = [
    ("gelu", Activation::Gelu),
    ("gelu_new", Activation::GeluTanh),
    ("gelu_pytorch_tanh", Activation::GeluTanh),
];

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let mut spec = super::dense_config::dense_spec(cfg, Architecture::GptNeox, name)?;
    let bias = cfg.bool_or("attention_bias", true)?;
    (spec.qkv_bias, spec.o_bias, spec.mlp_bias) = (bias, bias, true);
    spec.norm = NormKind::LayerBias;
    spec.rms_norm_eps = cfg.f64_or("layer_norm_eps", 1e-5)?;
    // transformers 5 takes `rotary_pct` only where `rope_parameters` names no factor.
    let rope_factor = cfg
        .get("rope_parameters")
        .and_then(|p| p.get("partial_rotary_factor"));
    let pct = cfg.get("rotary_pct").and_then(serde_json::Value::as_f64);
    spec.rotary_dim = Some(match pct {
        Some(pct) if rope_factor.is_none() => rotated(cfg, spec.head_dim, pct)?,
        _ => super::hybrid_config::rotary_dim(cfg, spec.head_dim, 0.25)?,
    });
    let theta_named = cfg.has("rope_theta") || cfg.get("rope_parameters").is_some();
    if !theta_named && let Some(base) = cfg.get("rotary_emb_base") {
        spec.rope_theta = base
            .as_f64()
            .filter(|b| b.is_finite() && *b > 0.0)
            .ok_or_else(|| cfg.err("rotary_emb_base", format!("{base} (a positive number)")))?;
    }
    spec.parallel_residual = cfg.bool_or("use_parallel_residual", true)?;
    spec.exact_gelu = activation(cfg)? == Activation::Gelu;
    Ok(spec)
}

/// `int(head_dim · rotary_pct)`, as the class computes it.
fn rotated(cfg: &Cfg<'_>, head_dim: usize, pct: f64) -> Result<usize, ModelError> {
    let dims = (head_dim as f64 * pct) as usize;
    if dims == 0 || !dims.is_multiple_of(2) || dims > head_dim {
        let m = format!("{pct} gives rotary dim {dims} for head_dim {head_dim}");
        return Err(cfg.err("rotary_pct", m));
    }
    Ok(dims)
}

/// The MLP's activation named by `hidden_act` (absent: the class's `gelu`).
fn activation(cfg: &Cfg<'_>) -> Result<Activation, ModelError> {
    let name = cfg.str_or("hidden_act", "gelu")?;
    let known = ACTIVATIONS.iter().find(|(n, _)| *n == name);
    known
        .map(|&(_, a)| a)
        .ok_or_else(|| ModelError::Unsupported {
            path: cfg.path_buf(),
            what: format!("hidden_act `{name}` (gelu, gelu_new or gelu_pytorch_tanh)"),
        })
}

pub fn load<D: Device>(
    ld: &Loader<'_, D>,
    spec: ModelSpec,
) -> Result<super::decoder::Decoder<D>, ModelError> {
    let act = match spec.exact_gelu {
        true => Activation::Gelu,
        false => Activation::GeluTanh,
    };
    let (v, h) = (spec.vocab_size, spec.hidden_size);
    let vocab = match spec.tie_word_embeddings {
        true => Vocab::Tied(ld.linear1("gpt_neox.embed_in", v, h, false)?),
        false => Vocab::Untied {
            table: ld.table("gpt_neox.embed_in", v, h)?,
            head: ld.linear1("embed_out", v, h, false)?,
        },
    };
    let final_norm = ld.norm("gpt_neox.final_layer_norm", h, spec.norm)?;
    let layer = move |ld: &Loader<'_, D>, spec: &ModelSpec, i| load_layer(ld, spec, i, act);
    super::dense::load_around(ld, spec, (vocab, final_norm), layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
    act: Activation,
) -> Result<Layer<D>, ModelError> {
    let p = format!("gpt_neox.layers.{i}");
    let attention = Sublayer::Attention(load_attention(ld, spec, &p, i)?);
    let mlp = ungated_mlp(
        ld,
        spec,
        &format!("{p}.mlp"),
        ("dense_h_to_4h", "dense_4h_to_h"),
        act,
    )?;
    let norm = |n: &str| ld.norm(&format!("{p}.{n}"), spec.hidden_size, spec.norm);
    let [ln1, ln2] = [norm("input_layernorm")?, norm("post_attention_layernorm")?];
    if !spec.parallel_residual {
        return Ok(pre_norm_layer([ln1, ln2], attention, Sublayer::Mlp(mlp)));
    }
    let both = ParallelNormed {
        first: attention,
        norm: ln2,
        row: spec.row_norm(),
        second: Sublayer::Mlp(mlp),
    };
    Ok(Layer {
        parts: vec![Part::new(ln1, Sublayer::ParallelNormed(Box::new(both)))],
        scale: 1.0,
    })
}

/// The fused `query_key_value` (`[heads · 3 · head_dim, hidden]`, each head's q, k, v rows
/// together) regrouped as hsx's `[q | k | v]`, and `dense`.
fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let (h, hd, heads) = (spec.hidden_size, spec.head_dim, spec.num_heads);
    let name = format!("{p}.attention.query_key_value");
    // Head j's q rows start at 3 · hd · j, its k rows hd later, its v rows 2 · hd later.
    let ranges: Vec<(usize, usize)> = (0..3)
        .flat_map(|part| (0..heads).map(move |j| ((3 * j + part) * hd, hd)))
        .collect();
    let (w, b) = ld.selected_rows(&name, (3 * heads * hd, h), &ranges, spec.qkv_bias)?;
    let qkv = ld.dev.linear(w, spec.qkv_bias.then_some(b))?;
    let o = ld.linear1(&format!("{p}.attention.dense"), h, heads * hd, spec.o_bias)?;
    let rot = spec.rotated_dims();
    let rope = Rope::new(rot, spec.rope_theta, spec.rope_scaling);
    Ok(Attention {
        rope: Some((ld.dev.rope_table(&rope)?, rot)),
        variant: SoftmaxVariant::causal(),
        ..Attention::plain((qkv, o), spec, i)
    })
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

    /// Shaped as pythia-1b's released config (transformers 4 names: `rotary_pct`,
    /// `rotary_emb_base`): 8 heads of 256, 64 rotated, biased, parallel, untied.
    #[test]
    fn pythia_1b() {
        let v = json!({
            "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
            "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 8192,
            "layer_norm_eps": 1e-5, "max_position_embeddings": 2048,
            "num_attention_heads": 8, "num_hidden_layers": 16, "rotary_emb_base": 10000,
            "rotary_pct": 0.25, "tie_word_embeddings": false, "use_parallel_residual": true,
            "vocab_size": 50304, "torch_dtype": "float16"
        });
        let s = parse(&v).unwrap();
        assert_eq!(s.architecture, Architecture::GptNeox);
        assert_eq!((s.head_dim, s.rotated_dims(), s.num_kv_heads), (256, 64, 8));
        assert!(s.qkv_bias && s.o_bias && s.mlp_bias && s.parallel_residual);
        assert_eq!(
            (s.norm, s.rms_norm_eps, s.rope_theta),
            (NormKind::LayerBias, 1e-5, 1e4)
        );
        let mut other = v.clone();
        other["rotary_emb_base"] = json!(500000);
        assert_eq!(parse(&other).unwrap().rope_theta, 5e5);
        // As transformers 5 saves it: `rope_parameters` names the factor and the theta, and
        // wins over the old fields.
        other["rope_parameters"] =
            json!({"rope_type": "default", "rope_theta": 20000.0, "partial_rotary_factor": 0.5});
        let s = parse(&other).unwrap();
        assert_eq!((s.rotated_dims(), s.rope_theta), (128, 2e4));
        for (field, value, want) in [
            ("hidden_act", json!("relu"), "hidden_act `relu`"),
            ("rotary_pct", json!(0.001), "rotary_pct"),
            ("rotary_emb_base", json!(-1), "rotary_emb_base"),
        ] {
            let mut bad = v.clone();
            bad[field] = value;
            let e = parse(&bad).unwrap_err();
            assert!(e.contains(want), "{field}: `{e}` should name `{want}`");
        }
    }
}

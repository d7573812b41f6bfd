//! Mamba-1 (`MambaForCausalLM`: state-spaces/mamba-130m … 2.8b-hf) and Falcon-Mamba
//! (`FalconMambaForCausalLM`: Falcon-Mamba-7B, Falcon3-Mamba-7B): a stack of blocks
//! `x += mixer(norm(x))`, every mixer Mamba-1 ([`super::layers::Mamba1`]); Falcon-Mamba
//! RMS-norms dt_low, B and C without a weight (`mixer_rms_eps`). On-disk names:
//! `backbone.embeddings`, `backbone.layers.{i}.{norm,mixer}`, `backbone.norm_f`, `lm_head`
//! (tied by default).
//!
//! transformers' `hidden_states` for these classes has no embedding entry (entry `i` is block
//! `i`'s output); hsx's layer ids mean what they mean for every model (id 0 the embedding,
//! id `i` the stream after `i` blocks).

use super::config::{Architecture, Cfg, default_max_pos};
use super::decoder::{Decoder, FinalNorm};
use super::hybrid_config::{HybridSpec, LayerKind};
use super::layers::{
    CausalConv, Layer, Loader, Mamba1, Mamba1Dims, MixerNorm, Part, Sublayer, neg_exp,
};
use super::{ModelError, ModelSpec, QkNorm, RopeScaling, WeightDtype};
use crate::kernels::Device;

/// The mixers' geometry (`MambaConfig` / `FalconMambaConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct Mamba1Spec {
    /// `expand · hidden_size`.
    pub inner: usize,
    pub state_size: usize,
    pub dt_rank: usize,
    pub conv_kernel: usize,
    pub conv_bias: bool,
    /// in_proj / out_proj bias (`use_bias`).
    pub proj_bias: bool,
    /// The epsilon of the norms of dt, B and C (Falcon-Mamba's `mixer_rms_eps`, Jamba's
    /// `rms_norm_eps`); `None`: no norms (Mamba).
    pub mixer_rms_eps: Option<f64>,
    /// Those norms have weights (`{dt,b,c}_layernorm.weight`: Jamba).
    pub weighted_norms: bool,
}

/// The spec of a `MambaConfig` or `FalconMambaConfig`, with the classes' defaults.
/// (The two classes share their defaults.)
pub(super) fn parse(
    cfg: &Cfg<'_>,
    name: String,
    arch: Architecture,
) -> Result<ModelSpec, ModelError> {
    // `hidden_act` is both the convolution's activation and the gate's.
    cfg.check_activation()?;
    let hidden = cfg.usize_or("hidden_size", 768)?;
    let mixer = mixer(cfg, hidden, arch == Architecture::FalconMamba)?;
    let layers = vec![LayerKind::Mamba1; cfg.num_layers_or(32)?];
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 50280)?,
        hidden_size: hidden,
        num_layers: layers.len(),
        // No attention: the attention fields carry one head of the hidden width (never used).
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: hidden,
        intermediate_size: mixer.inner,
        rms_norm_eps: cfg.f64_or("layer_norm_epsilon", 1e-5)?,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", true)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(HybridSpec {
            layers,
            rotary_dim: 0,
            gdn: None,
            moe: None,
            mamba: None,
            mamba1: Some(mixer),
            nemotron_moe: None,
            mla: None,
        }),
        ..ModelSpec::base(name, arch)
    })
}

fn mixer(cfg: &Cfg<'_>, hidden: usize, falcon: bool) -> Result<Mamba1Spec, ModelError> {
    Ok(Mamba1Spec {
        inner: cfg.positive_or("expand", 2)?.saturating_mul(hidden),
        state_size: cfg.positive_or("state_size", 16)?,
        dt_rank: dt_rank(cfg, "time_step_rank", hidden)?,
        conv_kernel: cfg.positive_or("conv_kernel", 4)?,
        conv_bias: cfg.bool_or("use_conv_bias", true)?,
        proj_bias: cfg.bool_or("use_bias", false)?,
        mixer_rms_eps: match falcon {
            true => Some(cfg.f64_or("mixer_rms_eps", 1e-6)?),
            false => None,
        },
        weighted_norms: false,
    })
}

/// `field`: dt's projection rank, `"auto"` (the default) for ⌈hidden / 16⌉, as the classes
/// compute it.
pub(super) fn dt_rank(cfg: &Cfg<'_>, field: &str, hidden: usize) -> Result<usize, ModelError> {
    match cfg.get(field) {
        None => Ok(hidden.div_ceil(16)),
        Some(v) if v.as_str() == Some("auto") => Ok(hidden.div_ceil(16)),
        Some(_) => cfg.positive_or(field, 0),
    }
}

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let m = (spec.hybrid.as_ref().and_then(|h| h.mamba1.clone())).ok_or_else(|| {
        ModelError::InvalidOptions(format!(
            "{} spec without its Mamba-1 geometry",
            spec.architecture.hf_name()
        ))
    })?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "backbone.embeddings")?;
    let layers = (0..spec.num_layers)
        .map(|i| {
            let mixer = load_mixer(ld, &format!("backbone.layers.{i}.mixer"), h, &m, i)?;
            let norm = ld.vector(&format!("backbone.layers.{i}.norm.weight"), h)?;
            Ok(Layer {
                parts: vec![Part::new(norm, Sublayer::Mamba1(mixer))],
                scale: 1.0,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Norm(ld.vector("backbone.norm_f.weight", h)?),
        spec,
        vocab,
        layers,
        ple: None,
    })
}

/// The Mamba-1 mixer under `px`: `{in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj}`
/// (Jamba's adds `{dt,b,c}_layernorm`).
pub(super) fn load_mixer<D: Device>(
    ld: &Loader<'_, D>,
    px: &str,
    hidden: usize,
    m: &Mamba1Spec,
    state_layer: usize,
) -> Result<Mamba1<D>, ModelError> {
    let (inner, n, r, k) = (m.inner, m.state_size, m.dt_rank, m.conv_kernel);
    let name = |s: &str| format!("{px}.{s}");
    let x_proj = |range: (usize, usize)| -> Result<D::Linear, ModelError> {
        let shape = (r + 2 * n, inner);
        let (w, _) = ld.selected_rows(&name("x_proj"), shape, &[range], false)?;
        Ok(ld.dev.linear(w, None)?)
    };
    let conv_bias = match m.conv_bias {
        true => Some(ld.vector(&name("conv1d.bias"), inner)?),
        false => None,
    };
    let weight = |norm: &str, len: usize| match m.weighted_norms {
        true => ld.f32s(&name(&format!("{norm}.weight")), &[len]),
        false => Ok(vec![1.0; len]),
    };
    let mixer_norm = match m.mixer_rms_eps {
        Some(eps) => Some(MixerNorm {
            dt_weight: ld.dev.vector(&weight("dt_layernorm", r)?)?,
            ones_state: ld.dev.vector(&vec![1.0; n])?,
            eps,
        }),
        None => None,
    };
    let bc_weight = [weight("b_layernorm", n)?, weight("c_layernorm", n)?].concat();
    Ok(Mamba1 {
        in_proj: ld.linear1(&name("in_proj"), 2 * inner, hidden, m.proj_bias)?,
        conv: CausalConv {
            weight: (ld.dev).vector(&ld.f32s(&name("conv1d.weight"), &[inner, 1, k])?)?,
            bias: conv_bias,
            kernel: k,
            state_layer,
            silu: true,
        },
        x_proj_dt: x_proj((0, r))?,
        x_proj_bc: x_proj((r, 2 * n))?,
        dt_proj: ld.linear1(&name("dt_proj"), inner, r, false)?,
        neg_a: ld
            .dev
            .vector(&neg_exp(&ld.f32s(&name("A_log"), &[inner, n])?))?,
        d: ld.vector(&name("D"), inner)?,
        dt_bias: ld.vector(&name("dt_proj.bias"), inner)?,
        bc_weight: ld.dev.vector(&bc_weight)?,
        out_proj: ld.linear1(&name("out_proj"), hidden, inner, m.proj_bias)?,
        dims: Mamba1Dims {
            inner,
            d_state: n,
            dt_rank: r,
        },
        mixer_norm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::path::Path;

    fn parse_json(v: &Value) -> Result<ModelSpec, ModelError> {
        let cfg = Cfg::new(v, Path::new("config.json"))?;
        let arch = match v["architectures"][0].as_str() {
            Some("FalconMambaForCausalLM") => Architecture::FalconMamba,
            _ => Architecture::Mamba,
        };
        parse(&cfg, "m".into(), arch)
    }

    fn mixer_of(v: &Value) -> Mamba1Spec {
        parse_json(v).unwrap().hybrid.unwrap().mamba1.unwrap()
    }

    /// mamba-2.8b-hf's geometry: `time_step_rank` `auto` is ⌈2560 / 16⌉, tied by default.
    #[test]
    fn reads_the_mixers_with_the_class_defaults() {
        let v = json!({"architectures": ["MambaForCausalLM"], "hidden_size": 2560,
                       "num_hidden_layers": 64, "vocab_size": 50280, "time_step_rank": "auto"});
        let s = parse_json(&v).unwrap();
        let h = s.hybrid.as_ref().unwrap();
        assert_eq!(h.layers, vec![LayerKind::Mamba1; 64]);
        let want = Mamba1Spec {
            inner: 5120,
            state_size: 16,
            dt_rank: 160,
            conv_kernel: 4,
            conv_bias: true,
            proj_bias: false,
            mixer_rms_eps: None,
            weighted_norms: false,
        };
        assert_eq!(h.mamba1.as_ref(), Some(&want));
        assert!(s.tie_word_embeddings && h.mamba.is_none());
        // Falcon-Mamba: an explicit rank and its norms' epsilon (the class's default 1e-6).
        let f = json!({"architectures": ["FalconMambaForCausalLM"], "hidden_size": 64,
                       "expand": 3, "time_step_rank": 8, "state_size": 12});
        let m = mixer_of(&f);
        assert_eq!((m.inner, m.dt_rank, m.state_size), (192, 8, 12));
        assert_eq!(m.mixer_rms_eps, Some(1e-6));
    }

    #[test]
    fn refuses_what_it_cannot_run_by_name() {
        let cases = [
            ("hidden_act", json!("gelu"), "hidden_act `gelu`"),
            ("time_step_rank", json!(0), "time_step_rank"),
            ("time_step_rank", json!("half"), "time_step_rank"),
            ("state_size", json!(0), "state_size"),
            ("conv_kernel", json!(0), "conv_kernel"),
        ];
        for (field, value, want) in cases {
            let mut v = json!({"architectures": ["MambaForCausalLM"], "hidden_size": 64});
            v[field] = value;
            let e = parse_json(&v).unwrap_err().to_string();
            assert!(e.contains(want), "{field}: `{e}` should name `{want}`");
        }
    }
}

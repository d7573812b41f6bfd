//! Mamba-2 (`Mamba2ForCausalLM`: mamba2-130m … 2.7b, Mamba-Codestral-7B): a stack of blocks
//! `x += mixer(norm(x))`, every mixer Mamba-2 — Nemotron-H's blocks and names
//! (`backbone.embeddings`, `backbone.layers.{i}.{norm,mixer}`, `backbone.norm_f`), so
//! [`super::nemotron_h::load`] loads it. What differs is the config (`Mamba2Config`: `num_heads`,
//! `head_dim`, `state_size`, `n_groups`, …) and the clamp of `dt` in prefill, which is
//! `time_step_limit` (as Bamba's), not Nemotron-H's `time_step_min`.
//!
//! transformers' `hidden_states` for this class has no embedding entry (entry `i` is block
//! `i`'s output); hsx's layer ids mean what they mean for every model (id 0 the embedding,
//! id `i` the stream after `i` blocks).

use super::config::{Architecture, Cfg, default_max_pos};
use super::hybrid_config::{LayerKind, MambaNorm, MambaSpec};
use super::{ModelError, ModelSpec, QkNorm, RopeScaling, WeightDtype};

/// The spec of a `Mamba2Config`, with the class's defaults.
pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    let arch = Architecture::Mamba2;
    // The class's `hidden_act` is the convolution's activation.
    cfg.check_activation()?;
    let hidden = cfg.usize_or("hidden_size", 4096)?;
    let mamba = mixer(cfg, hidden)?;
    let layers = vec![LayerKind::Mamba2; cfg.num_layers_or(64)?];
    Ok(ModelSpec {
        vocab_size: cfg.usize_or("vocab_size", 32768)?,
        hidden_size: hidden,
        num_layers: layers.len(),
        // No attention: the attention fields carry the mixer's heads (never used).
        num_heads: mamba.num_heads,
        num_kv_heads: mamba.num_heads,
        head_dim: mamba.head_dim,
        intermediate_size: mamba.intermediate(),
        rms_norm_eps: cfg.f64_or("layer_norm_epsilon", 1e-5)?,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        max_position_embeddings: cfg.usize_or("max_position_embeddings", default_max_pos(arch))?,
        dtype: cfg.dtype()?.unwrap_or(WeightDtype::F32),
        hybrid: Some(super::granite_config::mamba_hybrid(layers, 0, None, mamba)),
        ..ModelSpec::base(name, arch)
    })
}

/// The mixers' geometry, checked as the class checks it: `num_heads · head_dim` is
/// `expand · hidden_size`.
fn mixer(cfg: &Cfg<'_>, hidden: usize) -> Result<MambaSpec, ModelError> {
    let inner = cfg.usize_or("expand", 2)?.saturating_mul(hidden);
    let heads = cfg.usize_or("num_heads", 128)?;
    let head_dim = cfg.usize_or("head_dim", 64)?;
    if heads == 0 || head_dim.checked_mul(heads) != Some(inner) {
        let m =
            format!("{heads} heads × head_dim {head_dim} is not expand · hidden_size = {inner}");
        return Err(cfg.err("num_heads", m));
    }
    let n_groups = cfg.usize_or("n_groups", 8)?;
    if n_groups == 0 || !heads.is_multiple_of(n_groups) {
        let m = format!("{n_groups} (must divide num_heads = {heads})");
        return Err(cfg.err("n_groups", m));
    }
    Ok(MambaSpec {
        num_heads: heads,
        head_dim,
        state_size: cfg.usize_or("state_size", 128)?,
        n_groups,
        conv_kernel: cfg.usize_or("conv_kernel", 4)?,
        time_step_min: super::granite_config::time_step_floor(cfg)?,
        conv_bias: cfg.bool_or("use_conv_bias", true)?,
        proj_bias: cfg.bool_or("use_bias", false)?,
        norm: MambaNorm::AfterGate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::path::Path;

    fn parse_json(v: &Value) -> Result<ModelSpec, ModelError> {
        parse(&Cfg::new(v, Path::new("config.json"))?, "m".into())
    }

    fn small() -> Value {
        json!({"architectures": ["Mamba2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
               "num_heads": 8, "head_dim": 16, "state_size": 16, "n_groups": 2, "vocab_size": 512})
    }

    #[test]
    fn reads_the_mixers_and_the_dt_floor() {
        let mut v = small();
        v["time_step_limit"] = json!([0.025, {"__float__": "Infinity"}]);
        let s = parse_json(&v).unwrap();
        let h = s.hybrid.as_ref().unwrap();
        assert_eq!(h.layers, vec![LayerKind::Mamba2; 3]);
        let m = h.mamba.as_ref().unwrap();
        let got = (
            m.num_heads,
            m.head_dim,
            m.state_size,
            m.n_groups,
            m.conv_kernel,
        );
        assert_eq!(got, (8, 16, 16, 2, 4));
        assert_eq!(
            (m.time_step_min, m.conv_bias, m.proj_bias),
            (0.025, true, false)
        );
        assert_eq!((s.rms_norm_eps, s.tie_word_embeddings), (1e-5, false));
        // The class's default limit (0, ∞): no floor.
        let m0 = parse_json(&small()).unwrap().hybrid.unwrap().mamba.unwrap();
        assert_eq!(m0.time_step_min, 0.0);
    }

    #[test]
    fn refuses_what_it_cannot_run_by_name() {
        let cases = [
            ("head_dim", json!(12), "num_heads"),
            ("n_groups", json!(3), "n_groups"),
            ("hidden_act", json!("gelu"), "hidden_act `gelu`"),
            ("time_step_limit", json!([0.0, 0.1]), "time_step_limit"),
        ];
        for (field, value, want) in cases {
            let mut v = small();
            v[field] = value;
            let e = parse_json(&v).unwrap_err().to_string();
            assert!(e.contains(want), "{field}: `{e}` should name `{want}`");
        }
    }
}

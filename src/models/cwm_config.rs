//! Code World Model's config (`CwmConfig`): Llama's fields (heads of 128, eps 1e-5) with
//! per-layer windows — `layer_types`, else every 4th layer from layer 0 full — of
//! `sliding_window` (8192), every layer with the one RoPE: llama3 scaling (theta 10⁶, factor
//! 16 over 8192 positions, low / high frequency factors 1 / 4) where the config names no RoPE.

use super::config::{Architecture, Cfg};
use super::{ModelError, ModelSpec};

pub(super) fn parse(cfg: &Cfg<'_>, name: String) -> Result<ModelSpec, ModelError> {
    // Its class RoPE is filled in before (`mistral_config::with_class_rope`).
    let spec = super::dense_config::dense_spec(cfg, Architecture::Cwm, name)?;
    windowed(cfg, spec)
}

fn windowed(cfg: &Cfg<'_>, mut spec: ModelSpec) -> Result<ModelSpec, ModelError> {
    let every_4th_full = (0..spec.num_layers).map(|i| !i.is_multiple_of(4)).collect();
    let rope = (spec.rope_theta, spec.rope_scaling);
    let windows = super::olmo_config::layer_windows(cfg, every_4th_full, 8192, rope)?;
    spec.windows = Some(windows);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{RopeScaling, parse_config as parse};

    #[test]
    fn cwm_defaults_windows_and_llama3_rope() {
        let mut v = json!({"architectures": ["CwmForCausalLM"], "hidden_size": 256,
            "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 6, "vocab_size": 100});
        let s = parse(&v).unwrap();
        assert_eq!((s.head_dim, s.rope_theta, s.rms_norm_eps), (128, 1e6, 1e-5));
        assert!(matches!(
            s.rope_scaling,
            RopeScaling::Llama3 { factor, .. } if factor == 16.0
        ));
        let w = s.windows.unwrap();
        assert_eq!(w.window, 8192);
        assert_eq!(w.sliding, [false, true, true, true, false, true]);
        assert_eq!(w.local_rope, (1e6, s.rope_scaling));
        // A `rope_theta` alone leaves the class's RoPE, as CwmConfig does.
        v["rope_theta"] = json!(5e5);
        assert_eq!(parse(&v).unwrap().rope_theta, 1e6);
        // A config's own RoPE and layer types.
        v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 5e5});
        v["layer_types"] = json!([
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention"
        ]);
        v["sliding_window"] = json!(64);
        let s = parse(&v).unwrap();
        assert_eq!((s.rope_theta, s.rope_scaling), (5e5, RopeScaling::None));
        let w = s.windows.unwrap();
        assert_eq!((w.window, w.sliding[..2].to_vec()), (64, vec![true, false]));
        v["sliding_window"] = json!(null);
        assert!(
            parse(&v)
                .unwrap_err()
                .to_string()
                .contains("sliding_window")
        );
    }
}

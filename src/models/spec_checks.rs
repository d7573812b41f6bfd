//! The checks a [`ModelSpec`] passes at load, so that a model that loads runs: every size
//! positive, head counts that divide, recurrent and MoE geometry the kernels can run, sizes
//! whose products fit in memory arithmetic.

use std::path::Path;

use super::hybrid_config::HybridSpec;
use super::{ModelError, ModelSpec};

impl ModelSpec {
    pub(super) fn validate(&self, path: &Path) -> Result<(), ModelError> {
        let bad = |field: &str, message: String| ModelError::Field {
            path: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(bad(field, "must be > 0".into()));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_kv_heads, self.num_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(
                "head_dim",
                format!("{} must be even for RoPE", self.head_dim),
            ));
        }
        if self.vocab_size > u32::MAX as usize {
            return Err(bad("vocab_size", "too large for u32 token ids".into()));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(bad(
                "rms_norm_eps",
                format!("invalid value {}", self.rms_norm_eps),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(bad(
                "rope_theta",
                format!("invalid value {}", self.rope_theta),
            ));
        }
        let too_big = |what: &str, dims: &[usize]| {
            dims.iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= isize::MAX as usize / 8)
                .map(|_| ())
                .ok_or_else(|| bad(what, format!("sizes {dims:?} overflow")))
        };
        too_big("vocab_size", &[self.vocab_size, self.hidden_size])?;
        too_big(
            "num_attention_heads",
            &[self.num_heads, self.head_dim, self.hidden_size],
        )?;
        too_big(
            "intermediate_size",
            &[self.intermediate_size, self.hidden_size, 2],
        )?;
        // Gemma 4 E2B / E4B's per-layer table and projection.
        if let Some(p) = self.gemma4.as_ref().and_then(|g| g.ple) {
            let field = "hidden_size_per_layer_input";
            too_big(field, &[p.vocab, self.num_layers, p.dim])?;
            too_big(field, &[self.hidden_size, self.num_layers, p.dim])?;
        }
        match &self.hybrid {
            Some(h) => check_hybrid(self, h).map_err(|(f, m)| bad(f, m)),
            None => Ok(()),
        }
    }
}

/// The hybrid geometry: `Err((field, why))`.
fn check_hybrid(spec: &ModelSpec, h: &HybridSpec) -> Result<(), (&'static str, String)> {
    if h.layers.len() != spec.num_layers {
        let m = format!(
            "{} layer kinds for {} layers",
            h.layers.len(),
            spec.num_layers
        );
        return Err(("layer_types", m));
    }
    if let Some(g) = &h.gdn {
        let dims = [
            g.num_k_heads,
            g.num_v_heads,
            g.k_head_dim,
            g.v_head_dim,
            g.conv_kernel,
        ];
        if dims.contains(&0) || !g.num_v_heads.is_multiple_of(g.num_k_heads) {
            let m = format!(
                "Gated DeltaNet heads {}/{} (value heads a multiple of key heads), head dims {}/{}, conv kernel {}: all must be > 0",
                g.num_v_heads, g.num_k_heads, g.k_head_dim, g.v_head_dim, g.conv_kernel
            );
            return Err(("linear_num_value_heads", m));
        }
    }
    if let Some(m) = &h.mamba {
        let dims = [
            m.num_heads,
            m.head_dim,
            m.state_size,
            m.n_groups,
            m.conv_kernel,
        ];
        if dims.contains(&0) {
            let msg = format!(
                "Mamba-2 heads {} of dim {} in {} groups, state {}, conv kernel {}: all must be > 0",
                m.num_heads, m.head_dim, m.n_groups, m.state_size, m.conv_kernel
            );
            return Err(("mamba_num_heads", msg));
        }
        // Groups dividing the heads also divide the inner width (heads × head_dim).
        if !m.num_heads.is_multiple_of(m.n_groups) {
            let msg = format!(
                "{} groups must divide {} Mamba heads",
                m.n_groups, m.num_heads
            );
            return Err(("n_groups", msg));
        }
        if !(m.time_step_min.is_finite() && m.time_step_min >= 0.0) {
            return Err((
                "time_step_limit",
                format!("invalid minimum {}", m.time_step_min),
            ));
        }
    }
    if let Some(m) = &h.nemotron_moe {
        super::nemotron_moe::check(m, spec.hidden_size)?;
    }
    if let Some(m) = &h.moe {
        if m.top_k == 0 || m.top_k > m.num_experts {
            let msg = format!("{} must be in 1..={}", m.top_k, m.num_experts);
            return Err(("num_experts_per_tok", msg));
        }
        if m.expert_intermediate == 0 || m.shared_intermediate == Some(0) {
            return Err(("moe_intermediate_size", "must be > 0".into()));
        }
        if let Some(choice) = m.grouped() {
            choice
                .group_size(m.num_experts)
                .map_err(|e| ("n_group", e))?;
            if !(choice.scale.is_finite() && choice.scale > 0.0) {
                let msg = format!("{} must be a positive number", choice.scale);
                return Err(("routed_scaling_factor", msg));
            }
        }
        if m.sparse_layers.len() != spec.num_layers {
            let msg = format!(
                "{} sparse flags for {} layers",
                m.sparse_layers.len(),
                spec.num_layers
            );
            return Err(("mlp_only_layers", msg));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn parse(v: &Value) -> Result<ModelSpec, ModelError> {
        ModelSpec::from_json(v, Path::new("config.json"), "m".into())
    }

    fn err(v: &Value) -> String {
        parse(v).unwrap_err().to_string()
    }

    fn dense() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 512
        })
    }

    fn next() -> Value {
        json!({
            "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 512, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32
        })
    }

    fn nemotron() -> Value {
        json!({
            "architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
            "hybrid_override_pattern": "M-*-", "num_hidden_layers": 4, "mamba_num_heads": 8,
            "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4
        })
    }

    fn with(mut v: Value, key: &str, val: Value) -> Value {
        v[key] = val;
        v
    }

    #[test]
    fn valid_configs_load() {
        for v in [dense(), next(), nemotron()] {
            parse(&v).unwrap();
        }
    }

    #[test]
    fn head_counts_that_do_not_divide_fail_at_load() {
        let e = err(&with(dense(), "num_key_value_heads", json!(3)));
        assert!(e.contains("does not divide"), "{e}");
        let e = err(&with(next(), "linear_num_value_heads", json!(3)));
        assert!(e.contains("linear_num_value_heads"), "{e}");
        let e = err(&with(nemotron(), "n_groups", json!(3)));
        assert!(e.contains("n_groups"), "{e}");
    }

    #[test]
    fn moe_top_k_and_sizes_fail_at_load() {
        let e = err(&with(next(), "num_experts_per_tok", json!(9)));
        assert!(e.contains("num_experts_per_tok"), "{e}");
        let e = err(&with(next(), "moe_intermediate_size", json!(0)));
        assert!(e.contains("moe_intermediate_size"), "{e}");
        let e = err(&with(next(), "linear_key_head_dim", json!(0)));
        assert!(e.contains("linear_num_value_heads"), "{e}");
    }

    #[test]
    fn zero_or_overflowing_sizes_fail_at_load() {
        let e = err(&with(nemotron(), "ssm_state_size", json!(0)));
        assert!(e.contains("mamba_num_heads"), "{e}");
        let e = err(&with(dense(), "vocab_size", json!(1u64 << 33)));
        assert!(e.contains("vocab_size"), "{e}");
        let huge = with(dense(), "hidden_size", json!(1u64 << 58));
        let e = err(&with(huge, "head_dim", json!(16)));
        assert!(e.contains("overflow"), "{e}");
    }
}

//! `random_model`'s model geometries (`--shape`), and the MoE models' expert tensors and config
//! (Qwen3-MoE, GLM-4.5).

use anyhow::{Result, bail};
use serde_json::json;

#[derive(Clone, Copy)]
pub struct Shape {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    /// Qwen3.5's Gated DeltaNet geometry; `None` for Llama.
    pub gdn: Option<Gdn>,
    /// Nemotron-H's Mamba-2 geometry; `None` for the others.
    pub mamba: Option<Mamba>,
    /// Qwen3-MoE's or GLM-4.5's routed experts; `None` for the others.
    pub moe: Option<Moe>,
}

/// Mamba-2 heads, head dim, state size, groups; and the block pattern (`M` Mamba-2, `-` MLP,
/// `*` attention).
#[derive(Clone, Copy)]
pub struct Mamba {
    pub heads: usize,
    pub head_dim: usize,
    pub d_state: usize,
    pub groups: usize,
    pub pattern: &'static str,
}

impl Mamba {
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }
    /// Conv channels: x | B | C.
    pub fn conv(&self) -> usize {
        self.inner() + 2 * self.groups * self.d_state
    }
}

/// Nemotron-H-8B's 52 blocks: 24 Mamba-2, 24 MLP, 4 attention.
pub const NEMOTRON_H_8B: &str = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";

/// Gated DeltaNet heads: key heads, value heads, key and value head dims.
#[derive(Clone, Copy)]
pub struct Gdn {
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
}

pub fn shape(name: &str) -> Result<Shape> {
    Ok(match name {
        // Llama-3.1-8B's geometry.
        "llama8b" => Shape {
            vocab: 128256,
            hidden: 4096,
            intermediate: 14336,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            rope_theta: 500000.0,
            gdn: None,
            mamba: None,
            moe: None,
        },
        // Llama-3.2-1B's geometry (untied here).
        "llama1b" => Shape {
            vocab: 128256,
            hidden: 2048,
            intermediate: 8192,
            layers: 16,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            rope_theta: 500000.0,
            gdn: None,
            mamba: None,
            moe: None,
        },
        "tiny" => Shape {
            vocab: 512,
            hidden: 64,
            intermediate: 128,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            rope_theta: 10000.0,
            gdn: None,
            mamba: None,
            moe: None,
        },
        // A 9B-class Qwen3.5 hybrid: the head geometry of Qwen3.5's config defaults (attention
        // head dim 256, linear heads 16 key / 32 value of 128), hidden 4096, 32 layers.
        "qwen35_9b" => Shape {
            vocab: 248320,
            hidden: 4096,
            intermediate: 12288,
            layers: 32,
            heads: 16,
            kv_heads: 4,
            head_dim: 256,
            rope_theta: 10_000_000.0,
            gdn: Some(Gdn {
                nk: 16,
                nv: 32,
                dk: 128,
                dv: 128,
            }),
            mamba: None,
            moe: None,
        },
        "qwen35_tiny" => Shape {
            vocab: 512,
            hidden: 64,
            intermediate: 128,
            layers: 4,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            rope_theta: 10000.0,
            gdn: Some(Gdn {
                nk: 2,
                nv: 4,
                dk: 16,
                dv: 16,
            }),
            mamba: None,
            moe: None,
        },
        // Nemotron-H-8B's geometry (its config.json): Mamba-2 with 128 heads of 64, state 128
        // in 8 groups; relu² MLP 21,504; attention 32 heads / 8 KV heads of 128.
        "nemotronh_8b" => Shape {
            vocab: 131072,
            hidden: 4096,
            intermediate: 21504,
            layers: NEMOTRON_H_8B.len(),
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            rope_theta: 10000.0,
            gdn: None,
            mamba: Some(Mamba {
                heads: 128,
                head_dim: 64,
                d_state: 128,
                groups: 8,
                pattern: NEMOTRON_H_8B,
            }),
            moe: None,
        },
        "nemotronh_tiny" => Shape {
            vocab: 512,
            hidden: 64,
            intermediate: 128,
            layers: 6,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            rope_theta: 10000.0,
            gdn: None,
            mamba: Some(Mamba {
                heads: 8,
                head_dim: 16,
                d_state: 16,
                groups: 2,
                pattern: "M-*-M-",
            }),
            moe: None,
        },
        // Qwen3-30B-A3B's geometry (its config.json): 128 experts of 768, 8 per token,
        // renormalised; attention 32 heads / 4 KV heads of 128 with q / k norms. 48 layers are
        // ~61 GB in bf16: `--layers N` keeps the first N (1.25 GB each).
        "qwen3moe_30b" => Shape {
            vocab: 151936,
            hidden: 2048,
            intermediate: 6144,
            layers: 48,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            rope_theta: 1_000_000.0,
            gdn: None,
            mamba: None,
            moe: Some(Moe {
                experts: 128,
                top_k: 8,
                inter: 768,
                glm_dense: None,
            }),
        },
        // `tiny` with 8 experts of 32, 2 per token.
        "qwen3moe_tiny" => Shape {
            rope_theta: 1_000_000.0,
            moe: Some(Moe {
                experts: 8,
                top_k: 2,
                inter: 32,
                glm_dense: None,
            }),
            ..shape("tiny")?
        },
        // GLM-4.5-Air's geometry (its config.json): layer 0 dense (10944), then 128 experts of
        // 1408, 8 per token, and a shared expert; 96 heads / 8 KV heads of 128, biased q/k/v.
        // 46 layers are ~221 GB in bf16: `--layers N` keeps the first N (4.7 GB per MoE layer).
        "glm45_air" => Shape {
            vocab: 151552,
            hidden: 4096,
            intermediate: 10944,
            layers: 46,
            heads: 96,
            kv_heads: 8,
            head_dim: 128,
            rope_theta: 1_000_000.0,
            gdn: None,
            mamba: None,
            moe: Some(Moe {
                experts: 128,
                top_k: 8,
                inter: 1408,
                glm_dense: Some(1),
            }),
        },
        // `tiny` as GLM-4.5: layer 0 dense, 8 experts of 32, 2 per token, a shared expert.
        "glm45_tiny" => Shape {
            rope_theta: 1_000_000.0,
            moe: Some(Moe {
                experts: 8,
                top_k: 2,
                inter: 32,
                glm_dense: Some(1),
            }),
            ..shape("tiny")?
        },
        other => {
            bail!(
                "unknown --shape {other:?} (llama8b, llama1b, tiny, qwen35_9b, qwen35_tiny, \
                 nemotronh_8b, nemotronh_tiny, qwen3moe_30b, qwen3moe_tiny, glm45_air, \
                 glm45_tiny)"
            )
        }
    })
}

/// Routed experts: every MoE layer's MLP is `experts` SwiGLU experts of `inter`, the `top_k` a
/// token's router picks renormalised. Qwen3-MoE (`Qwen3MoeForCausalLM`): softmax router, every
/// layer sparse, q / k norms.
#[derive(Clone, Copy)]
pub struct Moe {
    pub experts: usize,
    pub top_k: usize,
    pub inter: usize,
    /// GLM-4.5 (`Glm4MoeForCausalLM`) with its first `glm_dense` layers dense: the sigmoid
    /// router with its choice bias, a shared expert of `inter`, biased q / k / v without q / k
    /// norms, rotary on half of each head. `None`: Qwen3-MoE.
    pub glm_dense: Option<usize>,
}

impl Moe {
    /// Layer `i`'s (`p`) MLP tensors as Hugging Face names them: the router, then each
    /// expert's, then GLM-4.5's shared expert; GLM-4.5's dense layers a SwiGLU of `dense`.
    pub fn mlp_tensors(
        &self,
        p: &str,
        i: usize,
        hidden: usize,
        dense: usize,
    ) -> Vec<(String, Vec<usize>)> {
        let swiglu = |x: &str, inter: usize| {
            vec![
                (format!("{x}.gate_proj.weight"), vec![inter, hidden]),
                (format!("{x}.up_proj.weight"), vec![inter, hidden]),
                (format!("{x}.down_proj.weight"), vec![hidden, inter]),
            ]
        };
        if self.glm_dense.is_some_and(|d| i < d) {
            return swiglu(&format!("{p}.mlp"), dense);
        }
        let mut v = vec![(format!("{p}.mlp.gate.weight"), vec![self.experts, hidden])];
        if self.glm_dense.is_some() {
            v.push((
                format!("{p}.mlp.gate.e_score_correction_bias"),
                vec![self.experts],
            ));
        }
        for e in 0..self.experts {
            v.extend(swiglu(&format!("{p}.mlp.experts.{e}"), self.inter));
        }
        if self.glm_dense.is_some() {
            v.extend(swiglu(&format!("{p}.mlp.shared_experts"), self.inter));
        }
        v
    }

    /// config.json's fields over the Llama ones (Qwen3-30B-A3B's or GLM-4.5-Air's values).
    pub fn config(&self, rope_theta: f64) -> serde_json::Value {
        if let Some(dense) = self.glm_dense {
            return json!({
                "architectures": ["Glm4MoeForCausalLM"],
                "model_type": "glm4_moe",
                "n_routed_experts": self.experts,
                "num_experts_per_tok": self.top_k,
                "moe_intermediate_size": self.inter,
                "n_shared_experts": 1,
                "n_group": 1,
                "topk_group": 1,
                "routed_scaling_factor": 1.0,
                "norm_topk_prob": true,
                "first_k_dense_replace": dense,
                "attention_bias": true,
                "use_qk_norm": false,
                "partial_rotary_factor": 0.5,
                "rms_norm_eps": 1e-5,
                "rope_theta": rope_theta,
            });
        }
        json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "moe_intermediate_size": self.inter,
            "norm_topk_prob": true,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960,
            "rope_theta": rope_theta,
        })
    }
}

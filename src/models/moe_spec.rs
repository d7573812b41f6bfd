//! A MoE block's geometry and router ([`MoeSpec`], [`MoeRouter`]), as every MoE family's
//! config parser fills it in and `moe_weights` / the layers read it.

pub use crate::kernels::routing::DEFAULT_RENORM_EPS;
pub use crate::kernels::routing::GroupRank;
use crate::kernels::routing::{GroupedTopK, RouterScore};

/// Sparse MoE block: top-k routed SwiGLU experts, and for Qwen3-Next / Qwen3.5-MoE a
/// sigmoid-gated shared expert, for GLM-4.5 a plain one.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSpec {
    pub num_experts: usize,
    pub top_k: usize,
    pub expert_intermediate: usize,
    /// The shared expert's intermediate size; `None`: no shared expert.
    pub shared_intermediate: Option<usize>,
    pub norm_topk_prob: bool,
    /// Per layer: the MLP is the MoE block (else a dense MLP of `intermediate_size`).
    pub sparse_layers: Vec<bool>,
    pub router: MoeRouter,
}

/// How a MoE block picks each token's experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoeRouter {
    /// Softmax over the router's logits, top-k, renormalised when `norm_topk_prob` (Qwen,
    /// Mixtral); the shared expert (Qwen3-Next, Qwen3.5-MoE) is `shared_expert`, scaled by
    /// `sigmoid(shared_expert_gate(x))`.
    Softmax,
    /// DeepSeek-V3's group-limited sigmoid router ([`GroupedTopK`]) with
    /// `gate.e_score_correction_bias` (GLM-4.5), or with `softmax` DeepSeek-V2's over the
    /// softmax of the logits and no bias (Mistral 4) or ERNIE 4.5's with one; the shared expert
    /// is `shared_experts`, added as it is. `scale` is `routed_scaling_factor`.
    Grouped {
        n_group: usize,
        topk_group: usize,
        scale: f32,
        softmax: bool,
        /// The choice ranks the scores plus a correction bias (every sigmoid router; ERNIE
        /// 4.5's softmax one).
        bias: bool,
        /// Added to the renormalising sum ([`DEFAULT_RENORM_EPS`]; LFM2-MoE's 1e-6).
        renorm_eps: f32,
        /// What ranks the groups (DeepSeek-V2's best expert, else the best two's sum).
        group_rank: GroupRank,
    },
    /// Llama-4's: the top-k of the logits, weighted by their sigmoid (not renormalised), the
    /// weights scaling each expert's input; the shared expert `shared_expert` added as it is.
    Llama4,
    /// HunYuan-MoE's: [`Self::Softmax`]'s choice of `gate.wg`'s logits (renormalised), a shared
    /// MLP `shared_mlp` added as it is.
    HunYuan,
}

impl MoeRouter {
    /// One group's sigmoid router with a correction bias, its weights times `scale`
    /// (MiniMax-M2, HY V3, AFMoE).
    pub fn sigmoid(scale: f32) -> Self {
        Self::Grouped {
            n_group: 1,
            topk_group: 1,
            scale,
            softmax: false,
            bias: true,
            renorm_eps: DEFAULT_RENORM_EPS,
            group_rank: GroupRank::TopTwoSum,
        }
    }
}

impl MoeSpec {
    /// The grouped router's choice (`None` for the softmax router).
    pub fn grouped(&self) -> Option<GroupedTopK> {
        match self.router {
            MoeRouter::Softmax | MoeRouter::HunYuan => None,
            MoeRouter::Grouped {
                n_group,
                topk_group,
                scale,
                softmax,
                renorm_eps,
                group_rank,
                ..
            } => Some(GroupedTopK {
                top_k: self.top_k,
                n_group,
                topk_group,
                renorm: self.norm_topk_prob,
                renorm_eps,
                group_rank,
                scale,
                score: match softmax {
                    true => RouterScore::Softmax,
                    false => RouterScore::Sigmoid,
                },
            }),
            // The grouped choice with one group, no bias and the logits ranked.
            MoeRouter::Llama4 => Some(GroupedTopK {
                top_k: self.top_k,
                n_group: 1,
                topk_group: 1,
                renorm: false,
                renorm_eps: DEFAULT_RENORM_EPS,
                group_rank: GroupRank::TopTwoSum,
                scale: 1.0,
                score: RouterScore::SigmoidByLogit,
            }),
        }
    }
}

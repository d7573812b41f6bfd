//! gpt-oss's MoE block (transformers `GptOssMLP`): a biased router, the top-k experts'
//! softmax over their k logits (the same weights as a softmax over all experts renormalised
//! over the k, the form [`Device::moe_route`] computes), the token rows gathered into expert
//! order, per expert that got rows a biased `[gate | up]` GEMM, the clamped SwiGLU
//! `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)` with `g = min(gate, limit)`, a biased
//! down GEMM, and the combine that adds each token's experts in ascending expert order from
//! zero. There is no shared expert.

use super::moe::{Expert, ExpertAct, run_experts};
use super::{MoeScratch, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::DevResult;

pub struct GptOssMoe<D: Device> {
    /// `[experts, hidden]` + bias.
    pub router: D::Linear,
    /// `gate_up` rows `[gate (inter) | up (inter)]` (de-interleaved at load), biases included.
    pub experts: Vec<Expert<D>>,
    pub top_k: usize,
    pub inter: usize,
    pub hidden: usize,
    pub alpha: f32,
    pub limit: f32,
}

impl<D: Device> GptOssMoe<D> {
    pub(super) fn widths(&self) -> Widths {
        Widths {
            moe: Some((self.experts.len(), self.top_k, self.inter)),
            ..Widths::default()
        }
    }

    pub(super) fn forward(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        let m = MoeScratch::of(&mut s.moe)?;
        dev.matmul(&s.normed, &self.router, &mut m.logits)?;
        let routing = dev.moe_route(&m.logits, self.top_k, true)?;
        let sizes = (self.inter, self.hidden);
        let clamp = (self.alpha, self.limit);
        run_experts(
            dev,
            (&s.normed, None),
            &routing,
            &self.experts,
            sizes,
            m,
            ExpertAct::Other(|d: &D, gu: &D::Buf, act: &mut D::Buf| {
                d.swiglu_clamped(gu, clamp, act)
            }),
        )?;
        dev.moe_combine(&m.out, &routing, None, &mut s.proj)
    }
}

//! gpt-oss's MoE block (transformers `GptOssMLP`): a biased router, the top-k experts'
//! softmax over their k logits (the same weights as a softmax over all experts renormalised
//! over the k, the form [`Device::moe_route`] computes), the token rows gathered into expert
//! order, per expert that got rows a biased `[gate | up]` GEMM, the clamped SwiGLU
//! `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)` with `g = min(gate, limit)`, a biased
//! down GEMM, and the combine that adds each token's experts in ascending expert order from
//! zero. There is no shared expert: the combine's shared term is given as zeros.

use super::moe::{Expert, check_routing};
use super::{Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{DevResult, DeviceError};

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
        let m = s
            .moe
            .as_mut()
            .ok_or_else(|| DeviceError::Invalid("MoE block without MoE buffers".into()))?;
        dev.matmul(&s.normed, &self.router, &mut m.logits)?;
        let routing = dev.moe_route(&m.logits, self.top_k, true)?;
        let n = routing.rows.len();
        let tokens = routing.tok_pos.len() / self.top_k.max(1);
        dev.moe_gather(&s.normed, &routing, &mut m.rows)?;
        check_routing(&routing, n, &self.experts)?;
        let spans: Vec<_> = routing.offsets.windows(2).map(|w| w[0]..w[1]).collect();
        dev.resize(&mut m.gate_up, n, 2 * self.inter)?;
        for (expert, rows) in self.experts.iter().zip(&spans) {
            if !rows.is_empty() {
                dev.matmul_rows(&m.rows, rows.clone(), &expert.gate_up, &mut m.gate_up)?;
            }
        }
        dev.swiglu_clamped(&m.gate_up, (self.alpha, self.limit), &mut m.act)?;
        dev.resize(&mut m.out, n, self.hidden)?;
        for (expert, rows) in self.experts.iter().zip(spans) {
            if !rows.is_empty() {
                dev.matmul_rows(&m.act, rows, &expert.down, &mut m.out)?;
            }
        }
        // No shared expert: `+ 0 · 0` leaves every sum as it is.
        dev.resize(&mut m.shared, tokens, self.hidden)?;
        dev.resize(&mut m.gate, tokens, 1)?;
        dev.moe_combine(&m.out, &routing, (&m.shared, &m.gate), &mut s.proj)
    }
}

//! Sparse MoE block with a gated shared expert (Qwen3-Next / Qwen3.5-MoE,
//! transformers' `Qwen3NextSparseMoeBlock`): router logits, softmax top-k (optionally
//! renormalised), the token rows gathered into expert order, one GEMM pair per expert that got
//! rows (SwiGLU over all rows at once), the shared expert scaled by
//! `sigmoid(shared_expert_gate(x))`, and the combine that adds each token's experts in
//! ascending expert order from zero, then the shared expert's output.

use super::mlp::Mlp;
use super::{Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{DevResult, DeviceError};

/// One routed expert: stacked `[gate | up]` and `down`.
pub struct Expert<D: Device> {
    pub gate_up: D::Linear,
    pub down: D::Linear,
}

pub struct Moe<D: Device> {
    pub router: D::Linear,
    pub experts: Vec<Expert<D>>,
    pub shared: Mlp<D>,
    /// `shared_expert_gate` `[hidden]`.
    pub shared_gate: D::Vector,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub inter: usize,
    pub hidden: usize,
}

impl<D: Device> Moe<D> {
    pub(super) fn widths(&self) -> Widths {
        Widths {
            moe: Some((self.experts.len(), self.top_k, self.inter)),
            ..self.shared.widths()
        }
    }

    pub(super) fn forward(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        let m = s
            .moe
            .as_mut()
            .ok_or_else(|| DeviceError::Invalid("MoE block without MoE buffers".into()))?;
        dev.matmul(&s.normed, &self.router, &mut m.logits)?;
        let routing = dev.moe_route(&m.logits, self.top_k, self.norm_topk_prob)?;
        let n = routing.rows.len();
        dev.moe_gather(&s.normed, &routing, &mut m.rows)?;
        check_routing(&routing, n, &self.experts)?;
        let hidden = self.hidden;
        let spans = routing.offsets.windows(2).map(|w| w[0]..w[1]);
        dev.resize(&mut m.gate_up, n, 2 * self.inter)?;
        for (expert, rows) in self.experts.iter().zip(spans.clone()) {
            if !rows.is_empty() {
                dev.matmul_rows(&m.rows, rows, &expert.gate_up, &mut m.gate_up)?;
            }
        }
        dev.silu_mul(&m.gate_up, &mut m.act)?;
        dev.resize(&mut m.out, n, hidden)?;
        for (expert, rows) in self.experts.iter().zip(spans) {
            if !rows.is_empty() {
                dev.matmul_rows(&m.act, rows, &expert.down, &mut m.out)?;
            }
        }
        let wide = (&mut s.wide, &mut s.act);
        self.shared.run(dev, &s.normed, wide, &mut m.shared)?;
        dev.moe_shared_gate(&s.normed, &self.shared_gate, &mut m.gate)?;
        dev.moe_combine(&m.out, &routing, (&m.shared, &m.gate), &mut s.proj)
    }
}

pub(super) fn check_routing<D: Device>(
    routing: &crate::kernels::routing::Routing,
    n: usize,
    experts: &[Expert<D>],
) -> DevResult<()> {
    if routing.offsets.len() != experts.len() + 1 || routing.offsets.last() != Some(&n) {
        return Err(DeviceError::Invalid(format!(
            "routing of {n} rows over {} experts has {} offsets",
            experts.len(),
            routing.offsets.len()
        )));
    }
    Ok(())
}

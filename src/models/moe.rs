//! Qwen3-Next sparse MoE block: softmax router over all experts (f32), top-k, optional
//! renormalisation of the k weights, SiLU-gated experts, plus a shared expert scaled by
//! `sigmoid(shared_expert_gate(x))` — exactly transformers' `Qwen3NextSparseMoeBlock`.
//! Expert outputs are added to a zero row in ascending expert order (transformers'
//! `index_add_` loop), then the shared expert's output is added.

use super::hybrid_attn::load_linear;
use super::hybrid_config::MoeSpec;
use super::{ModelError, Weights};
use crate::kernels::cpu::matmul::{Linear, matmul_wt};
use crate::kernels::cpu::ops;
use crate::kernels::cpu::recurrent::sigmoid;

/// A SiLU-gated MLP: `down(silu(gate(x)) · up(x))`, gate and up stacked.
pub(super) struct GatedMlp {
    gate_up: Linear,
    down: Linear,
    inter: usize,
}

impl GatedMlp {
    pub(super) fn load(
        w: &Weights,
        prefix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            gate_up: Linear::concat(vec![
                load_linear(w, &format!("{prefix}.gate_proj"), inter, hidden, false)?,
                load_linear(w, &format!("{prefix}.up_proj"), inter, hidden, false)?,
            ]),
            down: load_linear(w, &format!("{prefix}.down_proj"), hidden, inter, false)?,
            inter,
        })
    }

    /// `out[m, hidden]` for `x[m, hidden]`.
    pub(super) fn forward(&self, x: &[f32], m: usize, threads: usize, out: &mut Vec<f32>) {
        let mut gu = Vec::new();
        let mut act = Vec::new();
        self.gate_up.forward(x, m, &mut gu, threads);
        ops::silu_mul(&gu, self.inter, &mut act);
        self.down.forward(&act, m, out, threads);
    }
}

pub(super) struct MoeBlock {
    router: Vec<f32>,
    experts: Vec<GatedMlp>,
    shared: GatedMlp,
    shared_gate: Vec<f32>,
    top_k: usize,
    norm_topk_prob: bool,
    hidden: usize,
}

impl MoeBlock {
    /// `prefix` = `...layers.{i}.mlp`; experts stored one tensor each (on-disk layout).
    pub(super) fn load(
        w: &Weights,
        prefix: &str,
        hidden: usize,
        m: &MoeSpec,
    ) -> Result<Self, ModelError> {
        let experts = (0..m.num_experts)
            .map(|e| {
                GatedMlp::load(
                    w,
                    &format!("{prefix}.experts.{e}"),
                    hidden,
                    m.expert_intermediate,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            router: w.tensor(&format!("{prefix}.gate.weight"), &[m.num_experts, hidden])?,
            experts,
            shared: GatedMlp::load(
                w,
                &format!("{prefix}.shared_expert"),
                hidden,
                m.shared_intermediate,
            )?,
            shared_gate: w.tensor(&format!("{prefix}.shared_expert_gate.weight"), &[1, hidden])?,
            top_k: m.top_k,
            norm_topk_prob: m.norm_topk_prob,
            hidden,
        })
    }

    /// `out[T, hidden]` for normed rows `x[T, hidden]`.
    pub(super) fn forward(&self, x: &[f32], threads: usize, out: &mut Vec<f32>) {
        let h = self.hidden;
        let t = x.len() / h;
        let e_count = self.experts.len();
        let mut logits = Vec::new();
        matmul_wt(x, t, h, &self.router, e_count, &mut logits, threads);
        // Per token: the chosen experts and their weights.
        let mut chosen: Vec<Vec<(usize, f32)>> = Vec::with_capacity(t);
        for l in logits.chunks_exact(e_count) {
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = l.iter().map(|&v| (v - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            let probs: Vec<f32> = exps.iter().map(|&v| v / sum).collect();
            let mut order: Vec<usize> = (0..e_count).collect();
            // descending probability, lower index first on ties
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let mut top: Vec<(usize, f32)> =
                order[..self.top_k].iter().map(|&e| (e, probs[e])).collect();
            if self.norm_topk_prob {
                let s: f32 = top.iter().map(|&(_, p)| p).sum();
                for (_, p) in &mut top {
                    *p /= s;
                }
            }
            chosen.push(top);
        }
        out.clear();
        out.resize(t * h, 0.0);
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for (e, expert) in self.experts.iter().enumerate() {
            let toks: Vec<(usize, f32)> = chosen
                .iter()
                .enumerate()
                .filter_map(|(tok, c)| c.iter().find(|&&(ce, _)| ce == e).map(|&(_, p)| (tok, p)))
                .collect();
            if toks.is_empty() {
                continue;
            }
            rows.clear();
            for &(tok, _) in &toks {
                rows.extend_from_slice(&x[tok * h..(tok + 1) * h]);
            }
            expert.forward(&rows, toks.len(), threads, &mut y);
            for (i, &(tok, p)) in toks.iter().enumerate() {
                for (o, &v) in out[tok * h..(tok + 1) * h]
                    .iter_mut()
                    .zip(&y[i * h..(i + 1) * h])
                {
                    *o += v * p;
                }
            }
        }
        let mut shared = Vec::new();
        self.shared.forward(x, t, threads, &mut shared);
        // One output column: a plain fixed-order dot per row (gemm with N = 1 was measured
        // not to be row-invariant for large M: Qwen3-Next files changed with the batch).
        for ((o, s), xr) in out
            .chunks_exact_mut(h)
            .zip(shared.chunks_exact(h))
            .zip(x.chunks_exact(h))
        {
            let g: f32 = xr.iter().zip(&self.shared_gate).map(|(a, b)| a * b).sum();
            let sg = sigmoid(g);
            for (oi, &si) in o.iter_mut().zip(s) {
                *oi += sg * si;
            }
        }
    }
}

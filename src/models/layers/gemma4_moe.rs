//! Gemma 4's feed-forward block with experts (26B-A4B; transformers' `Gemma4TextDecoderLayer`
//! with `enable_moe_block`): the dense GeGLU MLP of the part's normed rows beside routed
//! experts of the residual stream itself, each output RMS-normed, then summed (the part's
//! post-norm follows). The router scores `proj(rms_norm(x) · scale · hidden^-½)` (its norm
//! unweighted), keeps the softmax's top-k renormalised, times a learned per-expert scale; the
//! experts (GeGLU) read `pre_feedforward_layernorm_2(x)`.

use super::mlp::Mlp;
use super::moe::{Expert, ExpertAct, run_experts};
use super::{MoeScratch, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{DevResult, RowNorm};

pub struct Gemma4Moe<D: Device> {
    pub mlp: Mlp<D>,
    /// `post_feedforward_layernorm_1`: the dense MLP's output.
    pub mlp_norm: D::Vector,
    /// `router.scale`: the weight of the router's RMSNorm.
    pub router_scale: D::Vector,
    /// `hidden^-½`, in f32.
    pub router_factor: f32,
    /// `router.proj` `[experts, hidden]`.
    pub router: D::Linear,
    /// `router.per_expert_scale` `[experts]`.
    pub expert_scale: Vec<f32>,
    pub top_k: usize,
    /// `pre_feedforward_layernorm_2`: the experts' input.
    pub experts_norm: D::Vector,
    pub experts: Vec<Expert<D>>,
    /// `post_feedforward_layernorm_2`: the experts' summed output.
    pub experts_out_norm: D::Vector,
    pub eps: f64,
    pub inter: usize,
    pub hidden: usize,
}

impl<D: Device> Gemma4Moe<D> {
    pub(super) fn widths(&self) -> Widths {
        let dense = self.mlp.widths();
        Widths {
            moe: Some((self.experts.len(), self.top_k, self.inter)),
            mid: dense.mid.max(self.hidden),
            aux: self.hidden,
            ..dense
        }
    }

    /// `s.proj` = `mlp_norm(mlp(s.normed)) + experts_out_norm(experts(s.x))`.
    pub(super) fn forward(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        let m = MoeScratch::of(&mut s.moe)?;
        let wide = (&mut s.wide, &mut s.act);
        self.mlp.run(dev, &s.normed, wide, &mut m.shared)?;
        dev.norm(
            &m.shared,
            &self.mlp_norm,
            RowNorm::rms(self.eps),
            &mut s.aux,
        )?;
        // The router's input, in f32 as transformers scales it, then the GEMM's dtype.
        dev.norm(&s.x, &self.router_scale, RowNorm::rms(self.eps), &mut s.mid)?;
        dev.scale(&mut s.mid, self.router_factor)?;
        dev.cast(&s.mid, &mut s.normed)?;
        dev.matmul(&s.normed, &self.router, &mut m.logits)?;
        let mut routing = dev.moe_route(&m.logits, self.top_k, true)?;
        routing.scale_by_expert(&self.expert_scale);
        dev.norm(
            &s.x,
            &self.experts_norm,
            RowNorm::rms(self.eps),
            &mut s.normed,
        )?;
        let geglu = |d: &D, gate_up: &D::Buf, act: &mut D::Buf| d.gelu_tanh_mul(gate_up, act);
        let sizes = (self.inter, self.hidden);
        let act = ExpertAct::Other(geglu);
        run_experts(
            dev,
            (&s.normed, None),
            &routing,
            &self.experts,
            sizes,
            m,
            act,
        )?;
        dev.moe_combine(&m.out, &routing, None, &mut m.shared)?;
        dev.norm(
            &m.shared,
            &self.experts_out_norm,
            RowNorm::rms(self.eps),
            &mut s.proj,
        )?;
        // transformers: hidden_states_1 + hidden_states_2 (the same sum either way round).
        dev.add(&mut s.proj, &s.aux)
    }
}

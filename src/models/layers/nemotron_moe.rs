//! Nemotron 3's MoE block (transformers' `NemotronHMoE`): the group-limited sigmoid router
//! ([`GroupedTopK`]) on the normed rows, routed experts `down(relu(up(x))²)` (not gated) on
//! those rows or on their latent projection `fc1(x)` (`moe_latent_size`), the experts' weighted
//! sum in ascending expert order (back through `fc2` when latent), then `+ shared(x)` of a
//! relu² shared expert — the order transformers adds them in.

use super::mlp::Mlp;
use super::moe::check_routing;
use super::{MoeScratch, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{DevResult, DeviceError, UnaryAct};
use crate::kernels::routing::GroupedTopK;

/// One routed expert: `up` `[inter, in]`, `down` `[in, inter]`.
pub struct Relu2Expert<D: Device> {
    pub up: D::Linear,
    pub down: D::Linear,
}

pub struct NemotronMoe<D: Device> {
    /// `gate.weight` `[experts, hidden]`.
    pub router: D::Linear,
    /// `gate.e_score_correction_bias` `[experts]`.
    pub bias: D::Vector,
    pub choice: GroupedTopK,
    pub experts: Vec<Relu2Expert<D>>,
    /// `fc1_latent_proj` `[latent, hidden]` and `fc2_latent_proj` `[hidden, latent]`.
    pub latent: Option<(D::Linear, D::Linear)>,
    /// The experts' input width: `moe_latent_size` or hidden.
    pub width: usize,
    pub inter: usize,
    pub shared: Mlp<D>,
}

impl<D: Device> NemotronMoe<D> {
    pub(super) fn widths(&self) -> Widths {
        let shared = self.shared.widths();
        let latent = if self.latent.is_some() { self.width } else { 0 };
        Widths {
            wide: shared.wide.max(latent),
            act: shared.act.max(latent),
            moe: Some((self.experts.len(), self.choice.top_k, self.inter)),
            ..shared
        }
    }

    pub(super) fn forward(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        let m = MoeScratch::of(&mut s.moe)?;
        dev.matmul(&s.normed, &self.router, &mut m.logits)?;
        let routing = dev.moe_route_grouped(&m.logits, &self.bias, &self.choice)?;
        let tokens = routing.tok_pos.len() / self.choice.top_k;
        let n = routing.rows.len();
        if routing.offsets.len() != self.experts.len() + 1 || routing.offsets.last() != Some(&n) {
            return Err(DeviceError::Invalid(format!(
                "routing of {n} rows over {} experts has {} offsets",
                self.experts.len(),
                routing.offsets.len()
            )));
        }
        match &self.latent {
            Some((fc1, _)) => {
                dev.matmul(&s.normed, fc1, &mut s.wide)?;
                dev.cast(&s.wide, &mut s.act)?;
                dev.moe_gather(&s.act, &routing, None, &mut m.rows)?;
            }
            None => dev.moe_gather(&s.normed, &routing, None, &mut m.rows)?,
        }
        // The experts' row spans must cover all n rows: `resize` leaves old values.
        check_routing(&routing, n, self.experts.len())?;
        let spans = routing.offsets.windows(2).map(|w| w[0]..w[1]);
        dev.resize(&mut m.gate_up, n, self.inter)?;
        for (expert, rows) in self.experts.iter().zip(spans.clone()) {
            if !rows.is_empty() {
                dev.matmul_rows(&m.rows, rows, &expert.up, &mut m.gate_up)?;
            }
        }
        dev.unary(&m.gate_up, UnaryAct::Relu2, &mut m.act)?;
        dev.resize(&mut m.out, n, self.width)?;
        for (expert, rows) in self.experts.iter().zip(spans) {
            if !rows.is_empty() {
                dev.matmul_rows(&m.act, rows, &expert.down, &mut m.out)?;
            }
        }
        match &self.latent {
            Some((_, fc2)) => {
                dev.moe_weighted_sum(&m.out, &routing, tokens, &mut s.act)?;
                dev.matmul(&s.act, fc2, &mut s.proj)?;
            }
            None => dev.moe_weighted_sum(&m.out, &routing, tokens, &mut s.proj)?,
        }
        self.shared
            .run(dev, &s.normed, (&mut s.wide, &mut s.act), &mut m.shared)?;
        dev.add(&mut s.proj, &m.shared)
    }
}

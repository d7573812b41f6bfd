//! Sparse MoE block (transformers' `Qwen3NextSparseMoeBlock`, `Qwen3MoeSparseMoeBlock`,
//! `MixtralSparseMoeBlock`, `Glm4MoeMoE`): router logits, softmax top-k (optionally
//! renormalised) or — GLM-4.5 — DeepSeek-V3's grouped sigmoid choice, the token rows gathered
//! into expert order (Llama-4: scaled there by their routing weights), one GEMM pair per
//! expert that got rows (SwiGLU over all rows at once; an expert no token chose is skipped),
//! and the combine that adds each token's experts in ascending expert order from zero (with
//! weight 1 where the inputs were scaled), then the shared expert's output: scaled by
//! `sigmoid(shared_expert_gate(x))` (Qwen3-Next / Qwen3.5-MoE) or as it is (GLM-4.5,
//! Llama-4).

use super::mlp::Mlp;
use super::{MoeScratch, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{DevResult, DeviceError};
use crate::kernels::routing::{GroupedTopK, Routing};

/// One routed expert: stacked `[gate | up]` and `down`.
pub struct Expert<D: Device> {
    pub gate_up: D::Linear,
    pub down: D::Linear,
}

/// The always-on expert of Qwen3-Next / Qwen3.5-MoE (with its sigmoid gate) and GLM-4.5.
pub struct SharedExpert<D: Device> {
    pub mlp: Mlp<D>,
    /// `shared_expert_gate` `[hidden]`; `None`: added ungated.
    pub gate: Option<D::Vector>,
}

/// How the block picks each token's experts from the router's logits.
pub enum Router<D: Device> {
    /// Softmax top-k, renormalised when `renorm`.
    Softmax { top_k: usize, renorm: bool },
    /// The grouped sigmoid choice ranking `sigmoid(logits) + bias` (`[experts]`).
    Grouped {
        bias: D::Vector,
        choice: GroupedTopK,
    },
}

impl<D: Device> Router<D> {
    fn top_k(&self) -> usize {
        match self {
            Self::Softmax { top_k, .. } => *top_k,
            Self::Grouped { choice, .. } => choice.top_k,
        }
    }

    fn route(&self, dev: &D, logits: &D::Buf) -> DevResult<Routing> {
        match self {
            Self::Softmax { top_k, renorm } => dev.moe_route(logits, *top_k, *renorm),
            Self::Grouped { bias, choice } => dev.moe_route_grouped(logits, bias, choice),
        }
    }
}

pub struct Moe<D: Device> {
    /// `gate.weight` `[experts, hidden]`: the router's logits.
    pub router: D::Linear,
    pub choice: Router<D>,
    pub experts: Vec<Expert<D>>,
    pub shared: Option<SharedExpert<D>>,
    /// The routing weights scale each expert's input rows instead of its output (Llama-4).
    pub weighs_input: bool,
    pub inter: usize,
    pub hidden: usize,
    /// Multiplies the block's output (Cohere 2 MoE's `average` of routed and shared: ½;
    /// 1 elsewhere, which changes no bit).
    pub out_scale: f32,
}

impl<D: Device> Moe<D> {
    pub(super) fn widths(&self) -> Widths {
        Widths {
            moe: Some((self.experts.len(), self.choice.top_k(), self.inter)),
            ..self
                .shared
                .as_ref()
                .map(|s| s.mlp.widths())
                .unwrap_or_default()
        }
    }

    pub(super) fn forward(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        self.routed_and_shared(dev, s)?;
        match self.out_scale {
            1.0 => Ok(()),
            // Exact for ½: `(routed + shared) / 2` as transformers computes it.
            f => dev.scale(&mut s.proj, f),
        }
    }

    fn routed_and_shared(&self, dev: &D, s: &mut Scratch<D>) -> DevResult<()> {
        let m = MoeScratch::of(&mut s.moe)?;
        dev.matmul(&s.normed, &self.router, &mut m.logits)?;
        let mut routing = self.choice.route(dev, &m.logits)?;
        let input_weights = self.weighs_input.then(|| routing.take_row_weights());
        let sizes = (self.inter, self.hidden);
        run_experts(
            dev,
            (&s.normed, input_weights.as_deref()),
            &routing,
            &self.experts,
            sizes,
            m,
            ExpertAct::<NoAct<D>>::SiluMul,
        )?;
        let Some(sh) = &self.shared else {
            return dev.moe_combine(&m.out, &routing, None, &mut s.proj);
        };
        let wide = (&mut s.wide, &mut s.act);
        sh.mlp.run(dev, &s.normed, wide, &mut m.shared)?;
        match &sh.gate {
            Some(gate) => {
                dev.moe_shared_gate(&s.normed, gate, &mut m.gate)?;
                dev.moe_combine(&m.out, &routing, Some((&m.shared, &m.gate)), &mut s.proj)
            }
            // transformers: routed + shared_experts(x).
            None => {
                dev.moe_combine(&m.out, &routing, None, &mut s.proj)?;
                dev.add(&mut s.proj, &m.shared)
            }
        }
    }
}

/// The routed experts of a MoE block: `x`'s rows gathered into expert order (`m.rows`; times
/// each row's `input_weights` where given), each expert's `[gate | up]` GEMM on its rows,
/// `act` over all rows at once (`m.gate_up` → `m.act`), each expert's down GEMM: the experts'
/// outputs in `m.out`, in expert order. An expert no token chose is skipped.
pub(super) fn run_experts<D: Device>(
    dev: &D,
    (x, input_weights): (&D::Buf, Option<&[f32]>),
    routing: &Routing,
    experts: &[Expert<D>],
    (inter, hidden): (usize, usize),
    m: &mut MoeScratch<D>,
    act: ExpertAct<impl FnOnce(&D, &D::Buf, &mut D::Buf) -> DevResult<()>>,
) -> DevResult<()> {
    let n = routing.rows.len();
    dev.moe_gather(x, routing, input_weights, &mut m.rows)?;
    check_routing(routing, n, experts.len())?;
    let spans = routing.offsets.windows(2).map(|w| w[0]..w[1]);
    let fused = match act {
        ExpertAct::SiluMul => fused_silu_mul(dev, experts, spans.clone(), (n, inter), m)?,
        ExpertAct::Other(_) => false,
    };
    if !fused {
        dev.resize(&mut m.gate_up, n, 2 * inter)?;
        for (expert, rows) in experts.iter().zip(spans.clone()) {
            if !rows.is_empty() {
                dev.matmul_rows(&m.rows, rows, &expert.gate_up, &mut m.gate_up)?;
            }
        }
        match act {
            ExpertAct::SiluMul => dev.silu_mul(&m.gate_up, &mut m.act)?,
            ExpertAct::Other(f) => f(dev, &m.gate_up, &mut m.act)?,
        }
    }
    dev.resize(&mut m.out, n, hidden)?;
    for (expert, rows) in experts.iter().zip(spans) {
        if !rows.is_empty() {
            dev.matmul_rows(&m.act, rows, &expert.down, &mut m.out)?;
        }
    }
    Ok(())
}

/// The closure type of [`ExpertAct::SiluMul`], which carries none.
type NoAct<D> = fn(&D, &<D as Device>::Buf, &mut <D as Device>::Buf) -> DevResult<()>;

/// The experts' activation between their two GEMMs.
pub(super) enum ExpertAct<F> {
    /// `silu(gate) · up` ([`Device::silu_mul`]), fused into the gate_up GEMMs where the device
    /// can.
    SiluMul,
    /// Any other, over all rows of `[gate | up]` at once.
    Other(F),
}

/// Each expert's `silu(gate) · up` straight into its rows of `m.act`, where the device fuses
/// it for every expert; false: not done (the unfused path recomputes every row).
fn fused_silu_mul<D: Device>(
    dev: &D,
    experts: &[Expert<D>],
    spans: impl Iterator<Item = std::ops::Range<usize>>,
    (n, inter): (usize, usize),
    m: &mut MoeScratch<D>,
) -> DevResult<bool> {
    dev.resize(&mut m.act, n, inter)?;
    for (expert, rows) in experts.iter().zip(spans) {
        if !rows.is_empty()
            && !dev.matmul_rows_silu_mul(&m.rows, rows, &expert.gate_up, &mut m.act)?
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The routing has one row span per expert and its spans end at `n` (they start at 0 and
/// follow each other by construction): together they cover every row.
pub(super) fn check_routing(routing: &Routing, n: usize, experts: usize) -> DevResult<()> {
    if routing.offsets.len() != experts + 1 || routing.offsets.last() != Some(&n) {
        return Err(DeviceError::Invalid(format!(
            "routing of {n} rows over {experts} experts has {} offsets",
            routing.offsets.len()
        )));
    }
    Ok(())
}

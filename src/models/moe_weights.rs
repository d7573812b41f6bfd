//! A sparse MoE block read from a checkpoint. Experts come in two layouts, both accepted:
//! - one tensor per expert and projection, as released checkpoints of Qwen3-MoE, Qwen3-Next and
//!   Mixtral store them and as transformers 5 writes them (`save_pretrained` reverses its
//!   load-time fusion): `experts.{e}.gate_proj` / `up_proj` / `down_proj` (Mixtral `w1` /
//!   `w3` / `w2`);
//! - fused 3-D tensors, transformers 5's in-memory form, in which released Qwen3.5-MoE
//!   checkpoints ship: `experts.gate_up_proj` `[E, 2·I, H]` (each expert's gate rows, then its
//!   up rows) and `experts.down_proj` `[E, H, I]`; or those transposed (`[E, H, 2·I]`,
//!   `[E, I, H]`), as Qwen3-VL-MoE ships them and Llama-4 always stores them.
//!
//! The router is `gate.weight` `[E, H]` (GLM-4.5 adds `gate.e_score_correction_bias` `[E]`,
//! MiniMax-M2 `e_score_correction_bias`, ERNIE 4.5 `moe_statics.e_score_correction_bias`
//! `[1, E]`; Llama-4's and Jamba's are `router.weight`);
//! Qwen3-Next / Qwen3.5-MoE add `shared_expert.*` and `shared_expert_gate.weight` `[1, H]`,
//! GLM-4.5 `shared_experts.*`, Llama-4 an ungated `shared_expert.*`; HunYuan-MoE's router is
//! `gate.wg.weight`, its ungated shared MLP `shared_mlp.*`.

use super::ModelError;
use super::hybrid_config::{MoeRouter, MoeSpec};
use super::layers::mlp::Activation;
use super::layers::moe::{Expert, Router, SharedExpert};
use super::layers::{Loader, Mlp, Moe};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;

/// Per-expert tensor names: (gate, up, down).
pub type ExpertNames = (&'static str, &'static str, &'static str);

/// Qwen's names (and transformers' for every family in memory).
pub const QWEN_EXPERTS: ExpertNames = ("gate_proj", "up_proj", "down_proj");
/// Mixtral's released names.
pub const MIXTRAL_EXPERTS: ExpertNames = ("w1", "w3", "w2");
/// Where a grouped sigmoid router keeps its correction bias (GLM-4.5, as transformers names it
/// for every family).
pub const GATE_BIAS: &str = "gate.e_score_correction_bias";

/// The MoE block under `prefix` (e.g. `model.layers.3.mlp`), its experts' tensors named
/// `names`, a grouped router's correction bias `router_bias` (both below `prefix`).
pub fn load<D: Device>(
    ld: &Loader<'_, D>,
    prefix: &str,
    hidden: usize,
    m: &MoeSpec,
    (names, router_bias): (ExpertNames, &str),
) -> Result<Moe<D>, ModelError> {
    let n = |s: &str| format!("{prefix}.{s}");
    let llama4 = m.router == MoeRouter::Llama4;
    let experts = match ld.w.contains(&n("experts.gate_up_proj")) {
        true => fused_experts(
            ld,
            prefix,
            hidden,
            (m.num_experts, m.expert_intermediate),
            llama4,
        )?,
        false => (0..m.num_experts)
            .map(|e| {
                let p = n(&format!("experts.{e}"));
                let mlp = swiglu(ld, &p, hidden, m.expert_intermediate, names)?;
                Ok(Expert {
                    gate_up: mlp.up,
                    down: mlp.down,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?,
    };
    let shared = match (m.shared_intermediate, m.router) {
        (Some(inter), MoeRouter::Softmax) => {
            let gate = ld.f32s(&n("shared_expert_gate.weight"), &[1, hidden])?;
            Some(SharedExpert {
                mlp: swiglu(ld, &n("shared_expert"), hidden, inter, QWEN_EXPERTS)?,
                gate: Some(ld.dev.vector(&gate)?),
            })
        }
        (Some(inter), MoeRouter::Grouped { .. }) => Some(SharedExpert {
            mlp: swiglu(ld, &n("shared_experts"), hidden, inter, QWEN_EXPERTS)?,
            gate: None,
        }),
        (Some(inter), MoeRouter::Llama4) => Some(SharedExpert {
            mlp: swiglu(ld, &n("shared_expert"), hidden, inter, QWEN_EXPERTS)?,
            gate: None,
        }),
        (Some(inter), MoeRouter::HunYuan) => Some(SharedExpert {
            mlp: swiglu(ld, &n("shared_mlp"), hidden, inter, QWEN_EXPERTS)?,
            gate: None,
        }),
        (None, _) => None,
    };
    let choice = match m.grouped() {
        Some(choice) => Router::Grouped {
            // Llama-4's and Mistral 4's routers have no bias.
            bias: match m.router {
                MoeRouter::Grouped { bias: true, .. } => {
                    ld.dev
                        .vector(&correction_bias(ld, &n(router_bias), m.num_experts)?)?
                }
                _ => ld.dev.vector(&vec![0.0; m.num_experts])?,
            },
            choice,
        },
        None => Router::Softmax {
            top_k: m.top_k,
            renorm: m.norm_topk_prob,
        },
    };
    let router = match m.router {
        MoeRouter::Llama4 => "router",
        MoeRouter::HunYuan => "gate.wg",
        // Jamba's softmax router is `router`.
        _ if !ld.w.contains(&n("gate.weight")) && ld.w.contains(&n("router.weight")) => "router",
        _ => "gate",
    };
    Ok(Moe {
        router: ld.linear1(&n(router), m.num_experts, hidden, false)?,
        choice,
        experts,
        shared,
        weighs_input: llama4,
        inter: m.expert_intermediate,
        hidden,
        out_scale: 1.0,
    })
}

/// A router's correction bias `[E]`, or `[1, E]` as ERNIE 4.5's `moe_statics` keeps it.
fn correction_bias<D: Device>(
    ld: &Loader<'_, D>,
    name: &str,
    e: usize,
) -> Result<Vec<f32>, ModelError> {
    match ld.w.shape_of(name)? == [1, e] {
        true => ld.f32s(name, &[1, e]),
        false => ld.f32s(name, &[e]),
    }
}

/// Experts of `experts.gate_up_proj` `[E, 2I, H]` and `experts.down_proj` `[E, H, I]`, or of
/// those stored transposed (`[E, H, 2I]`, `[E, I, H]`: released Qwen3-VL-MoE checkpoints);
/// `in_major`: always the transposed layout (Llama-4's own, whatever the shapes); `e` experts
/// of intermediate size `inter`.
pub fn fused_experts<D: Device>(
    ld: &Loader<'_, D>,
    prefix: &str,
    hidden: usize,
    (e, inter): (usize, usize),
    in_major: bool,
) -> Result<Vec<Expert<D>>, ModelError> {
    let stacked = |name: &str, out, inp| {
        fused(
            ld,
            &format!("{prefix}.experts.{name}"),
            (e, out, inp),
            in_major,
        )
    };
    let gate_up = stacked("gate_up_proj", 2 * inter, hidden)?;
    let down = stacked("down_proj", hidden, inter)?;
    (0..e)
        .map(|i| {
            Ok(Expert {
                gate_up: ld.dev.linear(gate_up.expert(i), None)?,
                down: ld.dev.linear(down.expert(i), None)?,
            })
        })
        .collect()
}

/// `n` stacked matrices `[out, in]` as stored: in that shape, or transposed (`[n, in, out]`).
struct Fused<'a> {
    m: HostMatrix<'a>,
    out: usize,
    inp: usize,
    transposed: bool,
}

impl Fused<'_> {
    /// Matrix `i` as `[out, in]`.
    fn expert(&self, i: usize) -> HostMatrix<'_> {
        match self.transposed {
            false => self.m.select_rows(&[(i * self.out, self.out)]),
            true => {
                let cols: Vec<usize> = (0..self.out).collect();
                self.m.transposed(i * self.inp..(i + 1) * self.inp, &cols)
            }
        }
    }
}

/// transformers' rule (`Transpose(1, 2, check_dims=True)`): the tensor is taken as it is when
/// it has the in-memory shape `[n, out, in]`, read as `[n, in, out]` and transposed when it
/// has that one (always, when `in_major`).
fn fused<'a, D: Device>(
    ld: &Loader<'a, D>,
    name: &str,
    (n, out, inp): (usize, usize, usize),
    in_major: bool,
) -> Result<Fused<'a>, ModelError> {
    // A tensor of neither shape is refused with the in-memory one named.
    let shape = ld.w.shape_of(name)?;
    let transposed = in_major || (shape != [n, out, inp] && shape == [n, inp, out]);
    let (rows, cols) = if transposed { (inp, out) } else { (out, inp) };
    Ok(Fused {
        m: ld.w.stacked(name, n, rows, cols)?,
        out,
        inp,
        transposed,
    })
}

/// A SwiGLU MLP of `{prefix}.{gate,up,down}.weight` (no bias).
pub fn swiglu<D: Device>(
    ld: &Loader<'_, D>,
    prefix: &str,
    hidden: usize,
    inter: usize,
    (gate, up, down): ExpertNames,
) -> Result<Mlp<D>, ModelError> {
    let n = |s: &str| format!("{prefix}.{s}");
    Ok(Mlp {
        up: ld.linear(&[(n(gate), inter), (n(up), inter)], hidden, false)?,
        down: ld.linear1(&n(down), hidden, inter, false)?,
        act: Activation::SwiGlu,
        inter,
    })
}

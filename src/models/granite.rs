//! Granite: Llama's decoder with three multipliers ([`GraniteSpec`]) — the embedding rows
//! times `embedding_multiplier`, each sublayer's output times `residual_multiplier` before
//! the residual add, attention scores times `attention_multiplier` (not `head_dim^-½`).
//!
//! - `GraniteForCausalLM` (Granite 3.x): Llama's layers and names; `HyperCLOVAXForCausalLM`
//!   adds an RMSNorm on each sublayer's output (`post_norm1`, `post_norm2`, Peri-LN);
//!   `GraniteSWAForCausalLM` per-head attention sinks (`self_attn.sinks`), sliding layers and a
//!   RoPE theta per layer.
//! - `GraniteMoeHybridForCausalLM` (Granite 4.0): per layer (`model.layers.{i}`) a mixer after
//!   `input_layernorm` — Mamba-2 (`mamba.*`, Nemotron-H's mixer) or attention (`self_attn.*`,
//!   RoPE only when `position_embedding_type` is `rope`) — then after
//!   `post_attention_layernorm` the SwiGLU `shared_mlp` (`input_linear` `[2·S, H]`: gate rows,
//!   then up rows; `output_linear`), alone or added to routed experts (`block_sparse_moe`:
//!   `router.layer` `[E, H]`, `input_linear` `[E, 2·I, H]`, `output_linear` `[E, H, I]`, as
//!   released and as transformers 5 saves them).
//! - `GraniteMoeForCausalLM` (Granite 3.0 / 3.1 MoE) and `GraniteMoeSharedForCausalLM`: Granite
//!   4.0's layers with RoPE attention in every one and its routed experts, without a shared MLP
//!   (the shared class: with one where `shared_intermediate_size` is above 0);
//!   `GraniteMoeSWAForCausalLM` the shared class's with Granite SWA's attention.

use super::decoder::Decoder;
use super::dense::{self, attention_layer, load_ffn};
use super::hybrid_config::{LayerKind, MoeSpec};
use super::layers::mlp::Activation;
use super::layers::moe::{Expert, Router, SharedExpert};
use super::layers::{Attention, Layer, Loader, Mlp, Moe, Part, SoftmaxVariant, Sublayer};
use super::nemotron_h::{load_attention, load_mamba};
use super::{Architecture, GraniteSpec, ModelError, ModelSpec};
use crate::kernels::Device;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let g = spec
        .granite
        .ok_or_else(|| ModelError::InvalidOptions("Granite spec without its multipliers".into()))?;
    let mut decoder = match spec.architecture {
        Architecture::GraniteMoeHybrid
        | Architecture::GraniteMoe
        | Architecture::GraniteMoeShared
        | Architecture::GraniteMoeSwa => {
            let kinds = spec.hybrid.as_ref().map(|h| h.layers.clone());
            let kinds = kinds.ok_or_else(|| missing(&spec, "its layer kinds"))?;
            dense::load_with(ld, spec, |ld, spec, i| {
                hybrid_layer(ld, spec, &g, &kinds, i)
            })?
        }
        _ => dense::load_with(ld, spec, |ld, spec, i| dense_layer(ld, spec, &g, i))?,
    };
    decoder.embed_scale = g.embedding;
    for part in decoder.layers.iter_mut().flat_map(|l| &mut l.parts) {
        part.residual_scale = g.residual;
    }
    Ok(decoder)
}

/// Causal attention, its scores times the attention multiplier.
fn scaled_scores<S>(g: &GraniteSpec, spec: &ModelSpec) -> SoftmaxVariant<S> {
    SoftmaxVariant {
        score_factor: g.score_factor(spec.head_dim),
        ..SoftmaxVariant::causal()
    }
}

/// Granite 3.x's (and HyperCLOVA X's) layer `i`: Llama's, its scores scaled by the attention
/// multiplier.
fn dense_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &GraniteSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let attention = match spec.architecture {
        Architecture::GraniteSwa => swa_attention(ld, spec, g, i)?,
        _ => dense::load_attention(ld, spec, i, scaled_scores(g, spec))?,
    };
    let ffn = load_ffn(ld, spec, &p, i)?;
    let mut layer = attention_layer(ld, spec, &p, Sublayer::Attention(attention), ffn)?;
    if g.post_norms {
        // HyperCLOVA X's Peri-LN: `x += r · post_norm(sublayer(norm(x)))`.
        for (part, n) in layer.parts.iter_mut().zip(["post_norm1", "post_norm2"]) {
            part.post_norm = Some(ld.vector(&format!("{p}.{n}.weight"), spec.hidden_size)?);
        }
    }
    Ok(layer)
}

/// Granite SWA's (and GraniteMoeSWA's) attention of layer `i`: per-head sinks, the layer's
/// window and RoPE.
fn swa_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &GraniteSpec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let sinks = ld.vector(&format!("model.layers.{i}.self_attn.sinks"), spec.num_heads)?;
    let variant = SoftmaxVariant {
        sinks: Some(sinks),
        ..scaled_scores(g, spec)
    };
    dense::load_windowed_attention(ld, spec, i, variant)
}

/// Granite 4.0's layer `i` (`kinds[i]` its mixer).
fn hybrid_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &GraniteSpec,
    kinds: &[LayerKind],
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let mixer = match spec.architecture {
        Architecture::GraniteMoeSwa => Sublayer::Attention(swa_attention(ld, spec, g, i)?),
        _ => mixer(ld, spec, kinds, i, scaled_scores(g, spec))?,
    };
    let h = spec.hidden_size;
    let moe = spec.hybrid.as_ref().and_then(|h| h.moe.as_ref());
    // Granite 3.0 MoE's experts have no shared MLP beside them.
    let shared = match moe.map(|m| m.shared_intermediate) {
        Some(None) => None,
        _ => Some(load_shared_mlp(ld, spec, &p)?),
    };
    let ffn = match (moe, shared) {
        (Some(m), shared) => Sublayer::Moe(load_moe(
            ld,
            h,
            &format!("{p}.block_sparse_moe"),
            m,
            shared,
        )?),
        (None, Some(shared)) => Sublayer::Mlp(shared),
        (None, None) => return Err(missing(spec, "experts or a shared MLP")),
    };
    let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
    Ok(Layer {
        parts: vec![
            Part::new(norm("input_layernorm")?, mixer),
            Part::new(norm("post_attention_layernorm")?, ffn),
        ],
        scale: 1.0,
    })
}

/// Layer `i`'s mixer (`model.layers.{i}`): Mamba-2 (`mamba.*`) or attention (`self_attn.*`,
/// its softmax `variant`), as `kinds[i]` says; Granite 4.0's and Bamba's names.
pub(super) fn mixer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    kinds: &[LayerKind],
    i: usize,
    variant: SoftmaxVariant<D::Vector>,
) -> Result<Sublayer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    // The mixer's index among the layers of its kind: its KV-cache or state layer.
    let ordinal = kinds[..i].iter().filter(|&&k| k == kinds[i]).count();
    Ok(match kinds[i] {
        LayerKind::Mamba2 => {
            let m = spec.hybrid.as_ref().and_then(|h| h.mamba.as_ref());
            let m = m.ok_or_else(|| missing(spec, "Mamba-2 geometry"))?;
            Sublayer::Mamba2(load_mamba(ld, &format!("{p}.mamba"), spec, m, ordinal)?)
        }
        LayerKind::Attention => {
            let px = format!("{p}.self_attn");
            Sublayer::Attention(load_attention(ld, &px, spec, ordinal, variant)?)
        }
        other => return Err(missing(spec, &format!("a {other:?} mixer"))),
    })
}

fn missing(spec: &ModelSpec, what: &str) -> ModelError {
    let arch = spec.architecture.hf_name();
    ModelError::InvalidOptions(format!("{arch} spec without {what}"))
}

/// Layer `p`'s `shared_mlp`: `input_linear` (gate rows, then up rows) and `output_linear`.
fn load_shared_mlp<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
) -> Result<Mlp<D>, ModelError> {
    let (h, inter) = (spec.hidden_size, spec.intermediate_size);
    Ok(Mlp {
        up: ld.linear1(&format!("{p}.shared_mlp.input_linear"), 2 * inter, h, false)?,
        down: ld.linear1(&format!("{p}.shared_mlp.output_linear"), h, inter, false)?,
        act: Activation::SwiGlu,
        inter,
    })
}

/// The routed experts under `px` (`block_sparse_moe`) and the layer's `shared` MLP, where it
/// has one, added to them as it is.
fn load_moe<D: Device>(
    ld: &Loader<'_, D>,
    h: usize,
    px: &str,
    m: &MoeSpec,
    shared: Option<Mlp<D>>,
) -> Result<Moe<D>, ModelError> {
    let (e, inter) = (m.num_experts, m.expert_intermediate);
    let n = |s: &str| format!("{px}.{s}");
    // GraniteMoeSWA's checkpoints keep transformers 5's module names (the same layouts).
    let (gate_up, down, router) = match ld.w.contains(&n("router.layer.weight")) {
        true => (
            "input_linear.weight",
            "output_linear.weight",
            "router.layer",
        ),
        false => ("experts.gate_up_proj", "experts.down_proj", "router"),
    };
    let gate_up = ld.w.stacked(&n(gate_up), e, 2 * inter, h)?;
    let down = ld.w.stacked(&n(down), e, h, inter)?;
    let experts = (0..e)
        .map(|i| {
            Ok(Expert {
                gate_up: ld
                    .dev
                    .linear(gate_up.select_rows(&[(i * 2 * inter, 2 * inter)]), None)?,
                down: ld.dev.linear(down.select_rows(&[(i * h, h)]), None)?,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Moe {
        router: ld.linear1(&n(router), e, h, false)?,
        choice: Router::Softmax {
            top_k: m.top_k,
            renorm: m.norm_topk_prob,
        },
        experts,
        shared: shared.map(|mlp| SharedExpert { mlp, gate: None }),
        weighs_input: false,
        inter,
        hidden: h,
        out_scale: 1.0,
    })
}

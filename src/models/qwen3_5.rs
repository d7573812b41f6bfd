//! Qwen3.5 (text), Qwen3.5-MoE (text) and Qwen3-Next: Gated DeltaNet layers and gated full
//! attention (zero-centred `(1 + w)` q/k norms, partial rotary), zero-centred RMSNorms, a
//! dense SwiGLU MLP (Qwen3.5) or a sparse MoE with a gated shared expert (Qwen3.5-MoE every
//! layer; Qwen3-Next per `decoder_sparse_step` / `mlp_only_layers`). Weights sit under
//! `model.` (a multimodal export's `model.language_model.` answers to it: `Weights`).
//!
//! Re-orderings at load (rows only, any dtype): the gated `q_proj` rows, per head
//! `[q(hd) | gate(hd)]` on disk, become `[q (all heads) | gate (all heads)]`, so the fused
//! projection is `[q | gate | k | v]`; Qwen3-Next's `in_proj_qkvz` / `in_proj_ba`, grouped per
//! key head, become Qwen3.5's `[q | k | v | z | b | a]`.

use super::decoder::{Decoder, FinalNorm};
use super::hybrid_config::{GdnSpec, HybridSpec, LayerKind};
use super::layers::{Attention, CausalConv, GatedDeltaNet, Layer, Loader, Part, Sublayer, neg_exp};
use super::moe_weights::{self, GATE_BIAS, QWEN_EXPERTS, swiglu};
use super::{Architecture, ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::{GdnDims, HostMatrix};
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let hybrid = spec.hybrid.clone().ok_or_else(|| missing(&spec))?;
    let gdn = hybrid.gdn.clone().ok_or_else(|| missing(&spec))?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let (mut attn, mut rec) = (0, 0);
    let mut layers = Vec::new();
    for i in 0..spec.num_layers {
        let index = match hybrid.layers[i] {
            LayerKind::Attention => &mut attn,
            _ => &mut rec,
        };
        let at = LayerAt { i, index: *index };
        *index += 1;
        layers.push(load_layer(ld, &spec, &hybrid, &gdn, at)?);
    }
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Norm(ld.norm_one_plus("model.norm", h)?),
        spec,
        vocab,
        layers,
        ple: None,
    })
}

fn missing(spec: &ModelSpec) -> ModelError {
    ModelError::InvalidOptions(format!(
        "{} spec without its Gated DeltaNet geometry",
        spec.architecture.hf_name()
    ))
}

/// Where a layer sits: layer index, index among the layers of its kind.
struct LayerAt {
    i: usize,
    index: usize,
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    hybrid: &HybridSpec,
    gdn: &GdnSpec,
    at: LayerAt,
) -> Result<Layer<D>, ModelError> {
    let (i, p) = (at.i, format!("model.layers.{}", at.i));
    let h = spec.hidden_size;
    let mixer = match hybrid.layers[i] {
        LayerKind::GatedDeltaNet => Sublayer::GatedDeltaNet(load_gdn(
            ld,
            &format!("{p}.linear_attn"),
            spec,
            gdn,
            at.index,
        )?),
        LayerKind::Attention => Sublayer::Attention(load_attention(
            ld,
            &format!("{p}.self_attn"),
            spec,
            hybrid.rotary_dim,
            at.index,
        )?),
        other => {
            return Err(ModelError::Unsupported {
                path: ld.w.dir().join("config.json"),
                what: format!("layer {i} of kind {other:?} in a Qwen3.5 / Qwen3-Next model"),
            });
        }
    };
    let mlp = format!("{p}.mlp");
    let ffn = match &hybrid.moe {
        Some(m) if m.sparse_layers[i] => Sublayer::Moe(moe_weights::load(
            ld,
            &mlp,
            h,
            m,
            (QWEN_EXPERTS, GATE_BIAS),
        )?),
        _ => Sublayer::Mlp(swiglu(ld, &mlp, h, spec.intermediate_size, QWEN_EXPERTS)?),
    };
    let norm = |n: &str| ld.norm_one_plus(&format!("{p}.{n}"), h);
    Ok(Layer {
        parts: vec![
            Part::new(norm("input_layernorm")?, mixer),
            Part::new(norm("post_attention_layernorm")?, ffn),
        ],
        scale: 1.0,
    })
}

/// Gated attention (`prefix` = `...layers.{i}.self_attn`).
pub(super) fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    prefix: &str,
    spec: &ModelSpec,
    rotary_dim: usize,
    kv_layer: usize,
) -> Result<Attention<D>, ModelError> {
    let (h, hd, nh) = (spec.hidden_size, spec.head_dim, spec.num_heads);
    let (qd, kvd) = (nh * hd, spec.num_kv_heads * hd);
    let n = |s: &str| format!("{prefix}.{s}");
    let q = ld.matrix(&n("q_proj.weight"), 2 * qd, h)?;
    let parts = vec![
        q.select_rows(&q_then_gate(nh, hd)),
        ld.matrix(&n("k_proj.weight"), kvd, h)?,
        ld.matrix(&n("v_proj.weight"), kvd, h)?,
    ];
    let qkv = HostMatrix::stack(parts).map_err(ModelError::Device)?;
    let bias = match spec.qkv_bias {
        true => {
            let qb = ld.f32s(&n("q_proj.bias"), &[2 * qd])?;
            let mut b: Vec<f32> = (q_then_gate(nh, hd).iter())
                .flat_map(|&(s, len)| qb[s..s + len].to_vec())
                .collect();
            b.extend(ld.f32s(&n("k_proj.bias"), &[kvd])?);
            b.extend(ld.f32s(&n("v_proj.bias"), &[kvd])?);
            Some(b)
        }
        false => None,
    };
    let norm = |s: &str| ld.norm_one_plus(&n(s), hd);
    let rope = Rope::new(rotary_dim, spec.rope_theta, spec.rope_scaling);
    Ok(Attention {
        qk_norm: Some((norm("q_norm")?, Some(norm("k_norm")?))),
        rope: Some((ld.dev.rope_table(&rope)?, rotary_dim)),
        gated: true,
        ..Attention::plain(
            (
                ld.dev.linear(qkv, bias)?,
                ld.linear1(&n("o_proj"), h, qd, spec.o_bias)?,
            ),
            spec,
            kv_layer,
        )
    })
}

/// `(start, count)` row ranges of a matrix, in the order to take them.
type RowRanges = Vec<(usize, usize)>;

/// Row ranges of per-head `[q(hd) | gate(hd)]` rows in `[q (all heads) | gate (all)]` order.
fn q_then_gate(heads: usize, hd: usize) -> RowRanges {
    (0..2)
        .flat_map(|part| (0..heads).map(move |h| (h * 2 * hd + part * hd, hd)))
        .collect()
}

/// The Gated DeltaNet under `p` (`...layers.{i}.linear_attn`), its state in recurrent layer
/// `state_layer`. Qwen3.5's projections, Qwen3-Next's fused ones ([`next_to_fused`]) or OLMo
/// Hybrid's separate `q k v g b a` (the gate `g` is Qwen's `z`; its norm `o_norm`, its
/// output `o_proj`) are stacked as `[q | k | v | z | b | a]`.
pub(super) fn load_gdn<D: Device>(
    ld: &Loader<'_, D>,
    p: &str,
    spec: &ModelSpec,
    g: &GdnSpec,
    state_layer: usize,
) -> Result<GatedDeltaNet<D>, ModelError> {
    let h = spec.hidden_size;
    let (kd, vd, nv, k) = (g.key_dim(), g.value_dim(), g.num_v_heads, g.conv_kernel);
    let conv_dim = g.conv_dim();
    let n = |s: &str| format!("{p}.{s}");
    let rows = |name: &str, r: usize| ld.matrix(&n(&format!("{name}.weight")), r, h);
    let parts = match spec.architecture {
        Architecture::Qwen3Next => {
            let (a, b) = next_to_fused(g);
            let qkvz = rows("in_proj_qkvz", 2 * kd + 2 * vd)?;
            vec![
                qkvz.select_rows(&a),
                rows("in_proj_ba", 2 * nv)?.select_rows(&b),
            ]
        }
        Architecture::OlmoHybrid => {
            let names = [
                ("q", kd),
                ("k", kd),
                ("v", vd),
                ("g", vd),
                ("b", nv),
                ("a", nv),
            ];
            (names.iter())
                .map(|&(x, r)| rows(&format!("{x}_proj"), r))
                .collect::<Result<_, _>>()?
        }
        _ => vec![
            rows("in_proj_qkv", conv_dim)?,
            rows("in_proj_z", vd)?,
            rows("in_proj_b", nv)?,
            rows("in_proj_a", nv)?,
        ],
    };
    let in_proj = HostMatrix::stack(parts).map_err(ModelError::Device)?;
    let (norm, out) = match spec.architecture {
        Architecture::OlmoHybrid => ("o_norm.weight", "o_proj"),
        _ => ("norm.weight", "out_proj"),
    };
    let a_log = ld.f32s(&n("A_log"), &[nv])?;
    let conv = match ld.w.contains(&n("q_conv1d.weight")) {
        true => split_conv(ld, p, (conv_dim, k))?,
        false => ld.f32s(&n("conv1d.weight"), &[conv_dim, 1, k])?,
    };
    Ok(GatedDeltaNet {
        in_proj: ld.dev.linear(in_proj, None)?,
        conv: CausalConv {
            weight: ld.dev.vector(&conv)?,
            bias: None,
            kernel: k,
            state_layer,
            silu: true,
        },
        neg_a: ld.dev.vector(&neg_exp(&a_log))?,
        dt_bias: ld.vector(&n("dt_bias"), nv)?,
        norm: ld.vector(&n(norm), g.v_head_dim)?,
        out_proj: ld.linear1(&n(out), h, vd, false)?,
        dims: GdnDims {
            nk: g.num_k_heads,
            nv,
            dk: g.k_head_dim,
            dv: g.v_head_dim,
        },
        eps: g.norm_eps.unwrap_or(spec.rms_norm_eps),
        beta_scale: g.beta_scale,
        gate: g.out_gate,
    })
}

/// OLMo Hybrid's releases keep one conv per q / k / v (`{p}.{q,k,v}_conv1d.weight`), which
/// transformers concatenates; its own saves split the whole in three equal parts, so only the
/// sum of their channels is checked (`conv_dim`), as transformers' loading does.
fn split_conv<D: Device>(
    ld: &Loader<'_, D>,
    p: &str,
    (conv_dim, k): (usize, usize),
) -> Result<Vec<f32>, ModelError> {
    let mut conv = Vec::with_capacity(conv_dim * k);
    for x in ["q", "k", "v"] {
        let name = format!("{p}.{x}_conv1d.weight");
        let channels = ld.w.shape_of(&name)?.first().copied().unwrap_or(0);
        conv.extend(ld.f32s(&name, &[channels, 1, k])?);
    }
    if conv.len() != conv_dim * k {
        return Err(ModelError::TensorShape {
            name: format!("{p}.{{q,k,v}}_conv1d.weight"),
            expected: vec![conv_dim, 1, k],
            found: vec![conv.len() / k.max(1), 1, k],
        });
    }
    Ok(conv)
}

/// Qwen3-Next's projections are grouped per key head — `in_proj_qkvz` rows
/// `[q(dk) | k(dk) | v(r·dv) | z(r·dv)]` and `in_proj_ba` rows `[b(r) | a(r)]` for each key head,
/// r = nv / nk (transformers `fix_query_key_value_ordering`): the row ranges of each, in the
/// Qwen3.5 order `[q | k | v | z]` and `[b | a]` (all heads of each part in head order).
fn next_to_fused(g: &GdnSpec) -> (RowRanges, RowRanges) {
    let (dk, dv, nk) = (g.k_head_dim, g.v_head_dim, g.num_k_heads);
    let r = g.num_v_heads / nk;
    let group = 2 * dk + 2 * r * dv;
    let parts = [
        (0, dk),
        (dk, dk),
        (2 * dk, r * dv),
        (2 * dk + r * dv, r * dv),
    ];
    let qkvz = (parts.iter())
        .flat_map(|&(off, len)| (0..nk).map(move |kh| (kh * group + off, len)))
        .collect();
    let ba = [0, r]
        .iter()
        .flat_map(|&off| (0..nk).map(move |kh| (kh * 2 * r + off, r)))
        .collect();
    (qkvz, ba)
}

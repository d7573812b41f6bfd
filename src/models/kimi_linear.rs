//! `KimiLinearForCausalLM` (Kimi Linear), as released (`model.*`): per layer
//! `input_layernorm` -> Kimi Delta Attention (`self_attn.{q,k,v}_proj`, `{q,k,v}_conv1d`,
//! `f_a_proj` / `f_b_proj`, `A_log` `[1, 1, h, 1]`, `dt_bias` `[h·d]`, `b_proj`, `g_a_proj` /
//! `g_b_proj`, `o_norm`, `o_proj`) or DeepSeek's multi-head latent attention without RoPE
//! ([`super::deepseek_v3::load_mla`]) -> `post_attention_layernorm` -> a dense SwiGLU MLP
//! (`mlp.*`, or `block_sparse_moe.*` as transformers saves it) or DeepSeek-V3's MoE
//! (`block_sparse_moe.gate` with its `e_score_correction_bias`, `experts.{e}.w1 / w3 / w2`,
//! `shared_experts`; or transformers' in-memory `mlp.*` with fused experts).

use super::decoder::Decoder;
use super::dense::{attention_layer, load_mlp, load_with};
use super::hybrid_config::{GdnSpec, LayerKind};
use super::layers::kda::{KimiDeltaAttention, LowRank};
use super::layers::mlp::Activation;
use super::layers::{CausalConv, Layer, Loader, Sublayer, neg_exp};
use super::moe_weights::{self, GATE_BIAS, MIXTRAL_EXPERTS, QWEN_EXPERTS};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let hybrid = spec.hybrid.as_ref();
    let parts = hybrid.and_then(|h| Some((h, h.mla.as_ref()?, h.gdn.as_ref()?)));
    let Some((hybrid, mla, kda)) = parts else {
        return Err(ModelError::InvalidOptions(
            "a Kimi Linear spec without its layer kinds, attention or KDA geometry".into(),
        ));
    };
    let p = format!("model.layers.{i}");
    let at = (i, hybrid.index_in_kind(i));
    let mixer = match hybrid.layers[i] {
        LayerKind::Attention => Sublayer::Mla(super::deepseek_v3::load_mla(ld, spec, mla, at)?),
        _ => Sublayer::Kda(load_kda(ld, spec, kda, at)?),
    };
    attention_layer(ld, spec, &p, mixer, load_ffn(ld, spec, &p, i)?)
}

/// Layer `p`'s feed-forward part: the MoE where the spec makes layer `i` sparse, else the
/// dense MLP.
fn load_ffn<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
    i: usize,
) -> Result<Sublayer<D>, ModelError> {
    let released = format!("{p}.block_sparse_moe");
    let moe = spec.hybrid.as_ref().and_then(|h| h.moe.as_ref());
    Ok(match moe {
        Some(m) if m.sparse_layers[i] => {
            let h = spec.hidden_size;
            Sublayer::Moe(match ld.w.contains(&format!("{released}.gate.weight")) {
                true => moe_weights::load(ld, &released, h, m, (MIXTRAL_EXPERTS, GATE_BIAS))?,
                false => {
                    moe_weights::load(ld, &format!("{p}.mlp"), h, m, (QWEN_EXPERTS, GATE_BIAS))?
                }
            })
        }
        _ => {
            let px = match ld.w.contains(&format!("{released}.gate_proj.weight")) {
                true => released,
                false => format!("{p}.mlp"),
            };
            Sublayer::Mlp(load_mlp(ld, spec, &px, Activation::SwiGlu)?)
        }
    })
}

/// Layer `i`'s Kimi Delta Attention, its state in recurrent layer `state_layer`.
fn load_kda<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &GdnSpec,
    (i, state_layer): (usize, usize),
) -> Result<KimiDeltaAttention<D>, ModelError> {
    let n = |s: &str| format!("model.layers.{i}.self_attn.{s}");
    let (hidden, heads, d, k) = (spec.hidden_size, g.num_v_heads, g.v_head_dim, g.conv_kernel);
    let c = heads * d;
    let rows = |name: &str, r: usize| ld.matrix(&n(&format!("{name}.weight")), r, hidden);
    let in_proj = [
        ("q_proj", c),
        ("k_proj", c),
        ("v_proj", c),
        ("b_proj", heads),
    ]
    .iter()
    .map(|&(name, r)| rows(name, r))
    .collect::<Result<Vec<_>, _>>()?;
    let conv = [("q", c), ("k", c), ("v", c)]
        .iter()
        .map(|&(x, r)| ld.f32s(&n(&format!("{x}_conv1d.weight")), &[r, 1, k]))
        .collect::<Result<Vec<_>, _>>()?
        .concat();
    let low_rank = |x: &str| {
        Ok::<_, ModelError>(LowRank {
            a: ld.linear1(&n(&format!("{x}_a_proj")), d, hidden, false)?,
            b: ld.linear1(&n(&format!("{x}_b_proj")), c, d, false)?,
        })
    };
    let a_log = ld.f32s(&n("A_log"), &[1, 1, heads, 1])?;
    Ok(KimiDeltaAttention {
        in_proj: ld.dev.linear(
            HostMatrix::stack(in_proj).map_err(ModelError::Device)?,
            None,
        )?,
        conv: CausalConv {
            weight: ld.dev.vector(&conv)?,
            bias: None,
            kernel: k,
            state_layer,
            silu: true,
        },
        forget: low_rank("f")?,
        gate: low_rank("g")?,
        neg_a: ld.dev.vector(&neg_exp(&a_log))?,
        dt_bias: ld.vector(&n("dt_bias"), c)?,
        norm: ld.vector(&n("o_norm.weight"), d)?,
        o_proj: ld.linear1(&n("o_proj"), hidden, c, false)?,
        heads,
        head_dim: d,
        rank: d,
        eps: spec.rms_norm_eps,
    })
}

//! `DeepseekV3ForCausalLM`, `AXK1ForCausalLM` (an RMSNorm `mlp.post_mlp_layernorm` on each
//! MoE block's output, released as `post_mlp_layernorm`), `YoutuForCausalLM` (dense SwiGLU
//! MLPs in every layer), `Glm4MoeLiteForCausalLM`, `Mistral4ForCausalLM`,
//! `DeepseekV32ForCausalLM` and `GlmMoeDsaForCausalLM` (`model.*` names; Mistral 4 adds the
//! query scale and the softmax router, DeepSeek-V3.2 and GLM-5 the sparse-attention indexer
//! `self_attn.indexer.{wq_b, wk, k_norm, weights_proj}`): per layer
//! `input_layernorm` -> multi-head latent attention (`self_attn.{q_proj | q_a_proj,
//! q_a_layernorm, q_b_proj}`, `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`) ->
//! `post_attention_layernorm` -> a dense SwiGLU MLP or DeepSeek-V3's MoE (`mlp.gate` with its
//! `e_score_correction_bias`, `mlp.experts.{e}`, `mlp.shared_experts`) as the spec's sparse
//! layers say. The multi-token prediction layers released checkpoints carry after the last
//! layer are not read.

use super::decoder::Decoder;
use super::deepseek_config::MlaSpec;
use super::dense::{attention_layer, load_ffn, load_with};
use super::layers::mla::{Indexer, MlaQuery, SparseAttention};
use super::layers::{Layer, Loader, MlaAttention, Sublayer};
use super::{Architecture, ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;
use crate::kernels::rope::Rope;

/// `DeepseekV3RMSNorm`'s default eps, which the q / kv latent norms keep.
const LATENT_EPS: f64 = 1e-6;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    // Youtu's spec has no MoE: every layer's MLP is dense.
    let Some(mla) = spec.hybrid.as_ref().and_then(|h| h.mla.as_ref()) else {
        return Err(ModelError::InvalidOptions(
            "a DeepSeek-V3 spec without its attention geometry".into(),
        ));
    };
    let attention = Sublayer::Mla(load_mla(ld, spec, mla, (i, i))?);
    let mut layer = attention_layer(ld, spec, &p, attention, load_ffn(ld, spec, &p, i)?)?;
    if spec.architecture == Architecture::Axk1
        && let Some(ffn) = layer.parts.get_mut(1)
        && matches!(ffn.sublayer, Sublayer::Moe(_))
    {
        // A.X K1: `x += post_mlp_layernorm(moe(norm(x)))`; its dense layers' norm is not read.
        let norm = format!("{p}.mlp.post_mlp_layernorm.weight");
        ffn.post_norm = Some(ld.vector(&norm, spec.hidden_size)?);
    }
    Ok(layer)
}

/// Layer `i`'s `self_attn`, its KV cache layer `kv_layer`. Kimi Linear's rotates nothing.
pub(super) fn load_mla<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    mla: &MlaSpec,
    (i, kv_layer): (usize, usize),
) -> Result<MlaAttention<D>, ModelError> {
    let a = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, d) = (spec.hidden_size, mla.dims);
    let (hd, kv_lora) = (d.head_dim(), mla.kv_lora);
    let q = match mla.q_lora {
        None => MlaQuery::Direct(ld.linear1(&a("q_proj"), d.heads * hd, h, false)?),
        Some(rank) => MlaQuery::Lora {
            a: ld.linear1(&a("q_a_proj"), rank, h, false)?,
            norm: ld.vector(&a("q_a_layernorm.weight"), rank)?,
            b: ld.linear1(&a("q_b_proj"), d.heads * hd, rank, false)?,
            rank,
        },
    };
    let kv_a = ld.matrix(&a("kv_a_proj_with_mqa.weight"), kv_lora + d.rope, h)?;
    let o = ld.matrix(&a("o_proj.weight"), h, d.heads * d.v)?;
    // Sized by the rotated dims: made once the projections' shapes have confirmed them.
    let rope = match spec.architecture {
        Architecture::KimiLinear => Rope::identity(d.rope),
        _ => Rope::new(d.rope, spec.rope_theta, spec.rope_scaling),
    };
    Ok(MlaAttention {
        q,
        kv_latent: ld.dev.linear(kv_a.select_rows(&[(0, kv_lora)]), None)?,
        kv_norm: ld.vector(&a("kv_a_layernorm.weight"), kv_lora)?,
        kv_b: ld.linear1(&a("kv_b_proj"), d.heads * (d.nope + d.v), kv_lora, false)?,
        k_rope: ld
            .dev
            .linear(kv_a.select_rows(&[(kv_lora, d.rope)]), None)?,
        o: ld.dev.linear(o.pad_col_groups(d.heads, d.v, hd), None)?,
        rope: ld.dev.rope_table(&rope)?,
        dims: d,
        kv_lora,
        latent_eps: LATENT_EPS,
        score_factor: mla.score_factor,
        temperature: spec.query_temperature,
        kv_layer,
        sparse: load_sparse(ld, mla, (i, h))?,
    })
}

/// Layer `i`'s DeepSeek Sparse Attention: its indexer (`self_attn.indexer.*`) unless it shares
/// the last one's selection.
fn load_sparse<D: Device>(
    ld: &Loader<'_, D>,
    mla: &MlaSpec,
    (i, hidden): (usize, usize),
) -> Result<Option<SparseAttention<D>>, ModelError> {
    let Some(dsa) = &mla.dsa else {
        return Ok(None);
    };
    let n = |x: &str| format!("model.layers.{i}.self_attn.indexer.{x}");
    let (h, d) = (dsa.heads, dsa.head_dim);
    let indexer = match (dsa.index_layer(i), mla.q_lora) {
        (None, _) => None,
        // The config parser refuses this; named here rather than run as a shared layer.
        (Some(_), None) => {
            let msg = "a sparse-attention indexer without q_lora_rank";
            return Err(ModelError::InvalidOptions(msg.into()));
        }
        (Some(index_layer), Some(rank)) => Some(Indexer {
            wq_b: ld.linear1(&n("wq_b"), h * d, rank, false)?,
            wk: ld.linear1(&n("wk"), d, hidden, false)?,
            k_norm: (
                ld.vector(&n("k_norm.weight"), d)?,
                ld.vector(&n("k_norm.bias"), d)?,
            ),
            weights_proj: {
                let w = ld.matrix(&n("weights_proj.weight"), h, hidden)?.to_f32();
                ld.dev.linear(HostMatrix::from_f32(&w, h, hidden), None)?
            },
            index_layer,
        }),
    };
    Ok(Some(SparseAttention {
        indexer,
        heads: h,
        head_dim: d,
        topk: dsa.topk,
        interleave: dsa.interleave,
    }))
}

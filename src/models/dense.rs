//! Attention-only decoders: Llama, Qwen2, Qwen3, Mistral, Ministral 3, SmolLM3 (its NoPE
//! layers without RoPE), StarCoder2 (its ungated MLP), StableLM (its residual parallel where
//! the config says), and the MoE ones
//! Qwen3-MoE, Mixtral, GLM-4.5 and MiniMax-M2 (`model.*` checkpoint names).
//!
//! Per layer: `input_layernorm` -> attention (fused q/k/v + bias, Qwen3's / GLM-4.5's per-head
//! q/k norm or MiniMax-M2's over the whole projection, RoPE incl. llama3 scaling, partial
//! rotary) -> `post_attention_layernorm` -> SwiGLU MLP, or the sparse MoE block where the
//! spec's MoE geometry makes the layer sparse (Qwen3-MoE and GLM-4.5 `mlp.*`, Mixtral and
//! MiniMax-M2 `block_sparse_moe.*` with experts `w1` / `w3` / `w2`). GLM-4.5 checkpoints also
//! hold the multi-token-prediction layer(s) after the last decoder layer (`model.layers.{L}.*`),
//! which transformers does not build either: not read.

use super::decoder::{Decoder, FinalNorm, Vocab};
use super::hybrid_config::MoeSpec;
use super::layers::mlp::Activation;
use super::layers::{Attention, Layer, Loader, Mlp, Moe, Part, SoftmaxVariant, Sublayer};
use super::moe_weights::{self, GATE_BIAS, MIXTRAL_EXPERTS, QWEN_EXPERTS};
use super::{Architecture, ModelError, ModelSpec, QkNorm, RopeScaling};
use crate::kernels::Device;
use crate::kernels::device::{HostMatrix, QkNormForm};
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    load_with(ld, spec, load_layer)
}

/// A decoder under `model.*` (embedding, `model.norm`, the LM head) whose layer i is
/// `layer(ld, spec, i)`.
pub fn load_with<D: Device>(
    ld: &Loader<'_, D>,
    spec: ModelSpec,
    layer: impl Fn(&Loader<'_, D>, &ModelSpec, usize) -> Result<Layer<D>, ModelError>,
) -> Result<Decoder<D>, ModelError> {
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let final_norm = ld.norm("model.norm", spec.hidden_size, spec.norm)?;
    load_around(ld, spec, (vocab, final_norm), layer)
}

/// A decoder of `vocab`, the layers `layer(ld, spec, i)` and the final norm's weights:
/// [`load_with`]'s, or a model's whose head or final norm is named otherwise (or has none).
pub(super) fn load_around<D: Device>(
    ld: &Loader<'_, D>,
    spec: ModelSpec,
    (vocab, final_norm): (Vocab<D>, D::Vector),
    layer: impl Fn(&Loader<'_, D>, &ModelSpec, usize) -> Result<Layer<D>, ModelError>,
) -> Result<Decoder<D>, ModelError> {
    let layers = (0..spec.num_layers)
        .map(|i| layer(ld, &spec, i))
        .collect::<Result<Vec<_>, _>>()?;
    let final_norm = FinalNorm::Norm(final_norm);
    Ok(Decoder {
        embed_scale: 1.0,
        spec,
        vocab,
        layers,
        ple: None,
        final_norm,
    })
}

/// Layer `i`'s `model.layers.{i}.self_attn` (q/k/v/o, q/k norms when the spec has them, RoPE)
/// with the mask and softmax of `variant`.
pub(super) fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
    variant: SoftmaxVariant<D::Vector>,
) -> Result<Attention<D>, ModelError> {
    let rope = (spec.rope_theta, spec.rope_scaling);
    load_attention_roped(ld, spec, i, variant, rope)
}

/// Layer `i`'s attention as the spec's [`super::config::LayerWindows`] make it: a sliding
/// layer's window and RoPE, a full layer's full causal attention with the spec's RoPE (none
/// where `nope_layers` says so; each layer's theta where the spec has `layer_thetas`), the rest
/// of the softmax as `base` says: OLMo 3, EXAONE 4.0, Cohere 2, Code World Model, Granite SWA.
pub(super) fn load_windowed_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
    base: SoftmaxVariant<D::Vector>,
) -> Result<Attention<D>, ModelError> {
    let w = spec.windows.as_ref().ok_or_else(|| {
        ModelError::InvalidOptions(format!("{:?} without its layer windows", spec.architecture))
    })?;
    let sliding = w.sliding[i];
    let variant = SoftmaxVariant {
        window: sliding.then_some(w.window),
        ..base
    };
    let rope = match (&spec.layer_thetas, sliding) {
        (Some(t), _) => (t[i], spec.rope_scaling),
        (None, true) => w.local_rope,
        (None, false) => (spec.rope_theta, spec.rope_scaling),
    };
    load_attention_roped(ld, spec, i, variant, rope)
}

/// [`load_attention`] with the RoPE (theta, scaling) `rope` (OLMo 3's sliding layers' own).
pub(super) fn load_attention_roped<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
    variant: SoftmaxVariant<D::Vector>,
    (theta, scaling): (f64, RopeScaling),
) -> Result<Attention<D>, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let norms = |(q, k): (usize, usize), (qn, kn): (&str, &str)| {
        Ok::<_, ModelError>(Some((
            ld.vector(&attn(&format!("{qn}.weight")), q)?,
            Some(ld.vector(&attn(&format!("{kn}.weight")), k)?),
        )))
    };
    // GLM-4.5 rotates the first `rotary_dim` dims of each head only.
    let rot = spec.rotated_dims();
    let qk_norm = match (spec.qk_norm, spec.interleaved_rope) {
        (QkNorm::PerHead, false) => norms((hd, hd), ("q_norm", "k_norm"))?,
        (QkNorm::Whole, false) => norms((qd, kvd), ("q_norm", "k_norm"))?,
        (QkNorm::PerHeadAfterRope, false) => norms((hd, hd), ("query_layernorm", "key_layernorm"))?,
        (QkNorm::HeadLayerNorm, interleaved) => {
            head_layer_norms(ld, spec, i, interleaved.then_some(rot))?
        }
        (QkNorm::None, _) => None,
        (_, true) => {
            let what = "q / k norms with interleaved RoPE".into();
            return Err(ModelError::InvalidOptions(what));
        }
    };
    let qkv = match spec.interleaved_rope {
        false => ld.linear(
            &[
                (attn("q_proj"), qd),
                (attn("k_proj"), kvd),
                (attn("v_proj"), kvd),
            ],
            h,
            spec.qkv_bias,
        )?,
        true => deinterleaved_qkv(ld, spec, i, rot)?,
    };
    // Sized by head_dim: made once the projections' shapes have confirmed it.
    let rope = match spec.nope_layers.as_ref().is_some_and(|n| n[i]) {
        true => None,
        false => {
            let rope = Rope::new(rot, theta, scaling);
            Some((ld.dev.rope_table(&rope)?, rot))
        }
    };
    attention_of(ld, spec, i, (qkv, qk_norm, rope), variant)
}

/// Layer `i`'s fused q / k / v projection (+ biases) with each q and k head's first `rot` rows
/// de-interleaved (`0, 2, 4, …, 1, 3, 5, …`): GLM-4's and ERNIE 4.5's interleaved pairs
/// `(2i, 2i + 1)` become the rotate-half pairs hsx rotates, at the same frequencies. q · k sums
/// the same products in another order; v and the output are untouched.
fn deinterleaved_qkv<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
    rot: usize,
) -> Result<D::Linear, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let (q_rows, k_rows) = (
        deinterleaved(spec.num_heads, hd, rot),
        deinterleaved(spec.num_kv_heads, hd, rot),
    );
    let matrix = |n: &str, rows| ld.matrix(&attn(&format!("{n}.weight")), rows, h);
    let qkv = HostMatrix::stack(vec![
        matrix("q_proj", qd)?.select_rows(&q_rows),
        matrix("k_proj", kvd)?.select_rows(&k_rows),
        matrix("v_proj", kvd)?,
    ])
    .map_err(ModelError::Device)?;
    let bias = match spec.qkv_bias {
        true => {
            let pick = |b: Vec<f32>, rows: &[(usize, usize)]| -> Vec<f32> {
                rows.iter().map(|&(r, _)| b[r]).collect()
            };
            let mut b = pick(ld.f32s(&attn("q_proj.bias"), &[qd])?, &q_rows);
            b.extend(pick(ld.f32s(&attn("k_proj.bias"), &[kvd])?, &k_rows));
            b.extend(ld.f32s(&attn("v_proj.bias"), &[kvd])?);
            Some(b)
        }
        false => None,
    };
    Ok(ld.dev.linear(qkv, bias)?)
}

/// Cohere's per-head q / k LayerNorm weights (`q_norm` / `k_norm` of `[heads, head_dim]`;
/// StableLM's `q_layernorm.norms.{h}` / `k_layernorm.norms.{h}`, one per head), each head's in
/// the order of its projection rows (`rot`: de-interleaved as
/// [`deinterleaved_qkv`] reorders them).
fn head_layer_norms<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
    rot: Option<usize>,
) -> Result<QkNormOf<D>, ModelError> {
    let (hd, attn) = (spec.head_dim, format!("model.layers.{i}.self_attn"));
    let norm = |n: &str, heads: usize| {
        let w = match spec.architecture {
            // StableLM's: one LayerNorm module per head.
            Architecture::StableLm => (0..heads)
                .map(|h| ld.f32s(&format!("{attn}.{n}_layernorm.norms.{h}.weight"), &[hd]))
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
            _ => ld.f32s(&format!("{attn}.{n}_norm.weight"), &[heads, hd])?,
        };
        let w = match rot {
            Some(rot) => (deinterleaved(heads, hd, rot).iter())
                .map(|&(r, _)| w[r])
                .collect(),
            None => w,
        };
        Ok::<_, ModelError>(ld.dev.vector(&w)?)
    };
    let (q, k) = (norm("q", spec.num_heads)?, norm("k", spec.num_kv_heads)?);
    Ok(Some((q, Some(k))))
}

/// The rows of `heads` heads of `hd` with each head's first `rot` rows de-interleaved.
fn deinterleaved(heads: usize, hd: usize, rot: usize) -> Vec<(usize, usize)> {
    let order = (0..rot / 2)
        .map(|j| 2 * j)
        .chain((0..rot / 2).map(|j| 2 * j + 1))
        .chain(rot..hd);
    let order: Vec<usize> = order.collect();
    (0..heads)
        .flat_map(|head| order.iter().map(move |&r| (head * hd + r, 1)))
        .collect()
}

/// An attention's q and k norm weights.
pub(super) type QkNormOf<D> = Option<(<D as Device>::Vector, Option<<D as Device>::Vector>)>;
/// An attention's RoPE table and rotated dims.
pub(super) type RopeOf<D> = Option<(<D as Device>::Rope, usize)>;

/// Layer `i`'s attention of the fused `qkv`, its q/k norms and RoPE, and `o_proj` (read here).
pub(super) fn attention_of<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
    (qkv, qk_norm, rope): (D::Linear, QkNormOf<D>, RopeOf<D>),
    variant: SoftmaxVariant<D::Vector>,
) -> Result<Attention<D>, ModelError> {
    let (h, qd) = (spec.hidden_size, spec.num_heads * spec.head_dim);
    let o = format!("model.layers.{i}.self_attn.o_proj");
    Ok(Attention {
        qk_norm,
        rope,
        variant,
        qk_norm_form: match spec.qk_norm {
            QkNorm::PerHeadAfterRope => QkNormForm::RmsAfterRope,
            QkNorm::HeadLayerNorm => QkNormForm::HeadLayerNorm,
            QkNorm::None | QkNorm::PerHead | QkNorm::Whole => QkNormForm::Rms,
        },
        ..Attention::plain((qkv, ld.linear1(&o, h, qd, spec.o_bias)?), spec, i)
    })
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let variant = SoftmaxVariant {
        window: spec.sliding_window,
        temperature: spec.query_temperature,
        ..SoftmaxVariant::causal()
    };
    let attention = match spec.windows {
        // Code World Model's sliding and full layers.
        Some(_) => load_windowed_attention(ld, spec, i, variant)?,
        None => load_attention(ld, spec, i, variant)?,
    };
    let ffn = load_ffn(ld, spec, &p, i)?;
    attention_layer(ld, spec, &p, Sublayer::Attention(attention), ffn)
}

/// Layer `i`'s (`p`) feed-forward part: its experts where the spec's MoE makes layer `i`
/// sparse, else the dense SwiGLU MLP.
pub(super) fn load_ffn<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
    i: usize,
) -> Result<Sublayer<D>, ModelError> {
    let moe = spec.hybrid.as_ref().and_then(|hy| hy.moe.as_ref());
    let act = match spec.architecture {
        Architecture::Arcee | Architecture::Jais2 => Activation::Relu2,
        _ => Activation::SwiGlu,
    };
    let px = format!("{p}.mlp");
    Ok(match moe {
        Some(m) if m.sparse_layers[i] => Sublayer::Moe(load_moe(ld, spec, p, m)?),
        _ if spec.architecture == Architecture::Starcoder2 => {
            let act = Activation::GeluTanh;
            Sublayer::Mlp(ungated_mlp(ld, spec, &px, ("c_fc", "c_proj"), act)?)
        }
        _ => Sublayer::Mlp(load_mlp(ld, spec, &px, act)?),
    })
}

/// Layer `p`'s (`model.layers.{i}`) two parts: `input_layernorm` + `attention`, then
/// `post_attention_layernorm` + `ffn`; or, where the spec's residual is parallel, one.
pub(super) fn attention_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
    attention: Sublayer<D>,
    ffn: Sublayer<D>,
) -> Result<Layer<D>, ModelError> {
    if spec.parallel_residual {
        return parallel_layer(ld, spec, p, attention, ffn);
    }
    let norm = |n: &str| ld.norm(&format!("{p}.{n}"), spec.hidden_size, spec.norm);
    let norms = [norm("input_layernorm")?, norm("post_attention_layernorm")?];
    Ok(pre_norm_layer(norms, attention, ffn))
}

/// Llama's layer shape: `x += attention(n0(x))`, then `x += ffn(n1(x))`, with the norms'
/// weights `[n0, n1]` (read however the architecture names or makes them).
pub(super) fn pre_norm_layer<D: Device>(
    [attention_norm, ffn_norm]: [D::Vector; 2],
    attention: Sublayer<D>,
    ffn: Sublayer<D>,
) -> Layer<D> {
    Layer {
        parts: vec![
            Part::new(attention_norm, attention),
            Part::new(ffn_norm, ffn),
        ],
        scale: 1.0,
    }
}

/// Layer `p`'s (`model.layers.{i}`) one part: `input_layernorm` feeding `attention` and `ffn`
/// in parallel (Cohere's layers, StableLM's `use_parallel_residual`). transformers:
/// `residual + attention + mlp`; hsx adds the two outputs first (the sum of the same three
/// values in another order: within f32 rounding).
fn parallel_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
    attention: Sublayer<D>,
    ffn: Sublayer<D>,
) -> Result<Layer<D>, ModelError> {
    let norm = ld.norm(&format!("{p}.input_layernorm"), spec.hidden_size, spec.norm)?;
    let both = Sublayer::Parallel(Box::new([attention, ffn]));
    Ok(Layer {
        parts: vec![Part::new(norm, both)],
        scale: 1.0,
    })
}

/// The ungated MLP `{px}.{down}(act({px}.{up}(x)))`, `intermediate_size` wide, biased where
/// the spec's `mlp_bias` (StarCoder2's `c_fc` / `c_proj`, Phi's `fc1` / `fc2`).
pub(super) fn ungated_mlp<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    px: &str,
    (up, down): (&str, &str),
    act: Activation,
) -> Result<Mlp<D>, ModelError> {
    let (h, inter, bias) = (spec.hidden_size, spec.intermediate_size, spec.mlp_bias);
    Ok(Mlp {
        up: ld.linear1(&format!("{px}.{up}"), inter, h, bias)?,
        down: ld.linear1(&format!("{px}.{down}"), h, inter, bias)?,
        act,
        inter,
    })
}

/// The dense MLP under `px` (`{px}.{gate,up,down}_proj`, `intermediate_size`, the spec's
/// `mlp_bias`): SwiGLU, Gemma's GeGLU, or relu² without a gate (`up_proj`, `down_proj`).
pub(super) fn load_mlp<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    px: &str,
    act: Activation,
) -> Result<Mlp<D>, ModelError> {
    load_mlp_of(ld, spec, px, (act, spec.intermediate_size))
}

/// [`load_mlp`] `inter` wide (Gemma 4's double-wide MLPs).
pub(super) fn load_mlp_of<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    px: &str,
    (act, inter): (Activation, usize),
) -> Result<Mlp<D>, ModelError> {
    let h = spec.hidden_size;
    let mlp = |n: &str| format!("{px}.{n}");
    let up = match act {
        Activation::Relu2 | Activation::Xielu(_) | Activation::GeluTanh | Activation::Gelu => {
            vec![(mlp("up_proj"), inter)]
        }
        Activation::SwiGlu | Activation::GeluTanhGlu => {
            vec![(mlp("gate_proj"), inter), (mlp("up_proj"), inter)]
        }
    };
    Ok(Mlp {
        up: ld.linear(&up, h, spec.mlp_bias)?,
        down: ld.linear1(&mlp("down_proj"), h, inter, spec.mlp_bias)?,
        act,
        inter,
    })
}

/// The MoE block of layer `p` (`model.layers.{i}`): Mixtral's and MiniMax-M2's under
/// `block_sparse_moe` with `w1` / `w3` / `w2` experts as released (or, saved from
/// transformers' in-memory names, under `mlp`), Qwen3-MoE's and GLM-4.5's under `mlp`.
fn load_moe<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &str,
    m: &MoeSpec,
) -> Result<Moe<D>, ModelError> {
    let h = spec.hidden_size;
    let arch = spec.architecture;
    // The router's correction bias: GLM-4.5's inside `gate` (K-EXAONE's as transformers renames
    // it), MiniMax-M2's and HY V3's beside it, ERNIE 4.5's in `gate.moe_statics` (as renamed).
    let bias = match arch {
        Architecture::MiniMaxM2 | Architecture::HyV3 | Architecture::Afmoe => {
            "e_score_correction_bias"
        }
        Architecture::Ernie4_5Moe => "gate.moe_statics.e_score_correction_bias",
        _ => GATE_BIAS,
    };
    let released = format!("{p}.block_sparse_moe");
    if matches!(arch, Architecture::Mixtral | Architecture::MiniMaxM2)
        && ld.w.contains(&format!("{released}.gate.weight"))
    {
        return moe_weights::load(ld, &released, h, m, (MIXTRAL_EXPERTS, bias));
    }
    moe_weights::load(ld, &format!("{p}.mlp"), h, m, (QWEN_EXPERTS, bias))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two heads of 6 with 4 rotated dims: rows 0, 2, 1, 3 then the passed-through 4, 5.
    #[test]
    fn rotated_rows_are_deinterleaved_per_head() {
        let rows: Vec<usize> = deinterleaved(2, 6, 4).iter().map(|r| r.0).collect();
        assert_eq!(rows, [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]);
    }
}

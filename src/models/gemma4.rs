//! Gemma 4 (`Gemma4ForCausalLM`, the 12B's `Gemma4UnifiedForCausalLM`; the language model of
//! their `…ForConditionalGeneration` exports, `model.language_model.*` answering to
//! `model.*`): Gemma-3's sandwich, its norms
//! with plain weights. Per layer `x += post_attention_layernorm(attention(input_layernorm(x)))`,
//! `x += post_feedforward_layernorm(ffn(pre_feedforward_layernorm(x)))`, then
//! `x *= layer_scalar`. The attention: per-head q / k norms and an unweighted v norm, scores
//! unscaled (`scaling` 1), sliding layers with a window and their RoPE, full layers with their
//! own head size and KV heads, proportional RoPE, and — with `attention_k_eq_v` — values from
//! the keys' projection (no `v_proj`). The ffn: a GeGLU MLP, or the 26B-A4B's MLP beside
//! routed experts ([`Gemma4Moe`]). Embeddings scaled by `√hidden` in the weights' dtype.
//!
//! E2B / E4B: per-layer embeddings ([`PerLayerEmbedding`]: each layer then adds
//! `post_per_layer_input_norm(per_layer_projection(gelu_tanh(per_layer_input_gate(x)) ·
//! its piece))` before `layer_scalar`), and the last `num_kv_shared_layers` layers attend over
//! the keys and values of the last unshared layer of their kind (no k / v projections, no
//! cache of their own; their MLPs twice as wide with `use_double_wide_mlp`).
//!
//! One KV cache serves every layer, as wide as the widest layer's K (or V): a narrower layer's
//! KV heads are repeated to fill it (their projection rows read twice: the same keys and
//! values, each query head still reading its own group's), so the 31B's full layers (4 KV
//! heads of 512) sit beside its sliding ones (16 of 256).

use super::decoder::Decoder;
use super::dense::{load_mlp_of, load_with};
use super::gemma3::embed_scale;
use super::layers::mlp::Activation;
use super::layers::{
    Attention, Gemma4Moe, Layer, Loader, Part, PerLayerEmbedding, PerLayerInput, SoftmaxVariant,
    Sublayer,
};
use super::moe_weights::fused_experts;
use super::{Gemma4Ple, Gemma4Spec, ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let g = spec.gemma4.clone().ok_or_else(|| {
        ModelError::InvalidOptions("Gemma4ForCausalLM spec without its layer geometry".into())
    })?;
    let scale = embed_scale(spec.hidden_size, spec.dtype);
    let ple = (g.ple.as_ref())
        .map(|p| load_ple(ld, &spec, p))
        .transpose()?;
    let mut decoder = load_with(ld, spec, |ld, spec, i| load_layer(ld, spec, &g, i))?;
    decoder.embed_scale = scale;
    decoder.ple = ple;
    Ok(decoder)
}

/// The per-layer embeddings' table, projection and norm.
fn load_ple<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &Gemma4Ple,
) -> Result<PerLayerEmbedding<D>, ModelError> {
    let (h, width) = (spec.hidden_size, spec.num_layers * p.dim);
    let table = "model.embed_tokens_per_layer";
    Ok(PerLayerEmbedding {
        table: ld.table(table, p.vocab, width)?,
        table_scale: embed_scale(p.dim, spec.dtype),
        proj: ld.linear1("model.per_layer_model_projection", width, h, false)?,
        proj_scale: (h as f64).powf(-0.5) as f32,
        norm: ld.vector("model.per_layer_projection_norm.weight", p.dim)?,
        eps: spec.rms_norm_eps,
        width,
    })
}

/// Layer `i`'s per-layer input part (no pre-norm: the gate reads the stream).
fn ple_part<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    p: &Gemma4Ple,
    i: usize,
) -> Result<Part<D>, ModelError> {
    let (h, px) = (spec.hidden_size, format!("model.layers.{i}"));
    let sublayer = Sublayer::PerLayerInput(PerLayerInput {
        gate: ld.linear1(&format!("{px}.per_layer_input_gate"), p.dim, h, false)?,
        proj: ld.linear1(&format!("{px}.per_layer_projection"), h, p.dim, false)?,
        layer: i,
        dim: p.dim,
    });
    let post = format!("{px}.post_per_layer_input_norm.weight");
    Ok(Part {
        norm: None,
        sublayer,
        post_norm: Some(ld.vector(&post, h)?),
        residual_scale: 1.0,
        hyper: None,
    })
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &Gemma4Spec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let h = spec.hidden_size;
    let norm = |n: &str| ld.vector(&format!("{p}.{n}.weight"), h);
    let part = |pre: &str, sublayer, post: &str| {
        Ok::<_, ModelError>(Part::sandwich(norm(pre)?, sublayer, norm(post)?))
    };
    let attention = Sublayer::Attention(load_attention(ld, spec, g, i)?);
    let inter = g.mlp_width(i, spec.intermediate_size);
    let mlp = load_mlp_of(
        ld,
        spec,
        &format!("{p}.mlp"),
        (Activation::GeluTanhGlu, inter),
    )?;
    let ffn = match g.moe {
        None => Sublayer::Mlp(mlp),
        Some(m) => Sublayer::Gemma4Moe(Gemma4Moe {
            mlp,
            mlp_norm: norm("post_feedforward_layernorm_1")?,
            router_scale: ld.vector(&format!("{p}.router.scale"), h)?,
            router_factor: (h as f64).powf(-0.5) as f32,
            router: ld.linear1(&format!("{p}.router.proj"), m.experts, h, false)?,
            expert_scale: ld.f32s(&format!("{p}.router.per_expert_scale"), &[m.experts])?,
            top_k: m.top_k,
            experts_norm: norm("pre_feedforward_layernorm_2")?,
            experts: fused_experts(ld, &p, h, (m.experts, m.inter), false)?,
            experts_out_norm: norm("post_feedforward_layernorm_2")?,
            eps: spec.rms_norm_eps,
            inter: m.inter,
            hidden: h,
        }),
    };
    let mut parts = vec![
        part("input_layernorm", attention, "post_attention_layernorm")?,
        part(
            "pre_feedforward_layernorm",
            ffn,
            "post_feedforward_layernorm",
        )?,
    ];
    if let Some(ple) = &g.ple {
        parts.push(ple_part(ld, spec, ple, i)?);
    }
    Ok(Layer {
        parts,
        scale: ld.f32s(&format!("{p}.layer_scalar"), &[1])?[0],
    })
}

/// Layer `i`'s attention: its head size and KV heads (repeated to the cache's width), its
/// kind's window and RoPE over the whole head; a KV-sharing layer's q alone, over the cache of
/// the layer it shares.
fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &Gemma4Spec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, heads) = (spec.hidden_size, spec.num_heads);
    let ((hd, kv), repeat) = (g.geometry[i], g.kv_repeat(i));
    let sliding = g.sliding[i];
    let v_name = match g.k_eq_v && !sliding {
        true => attn("k_proj"),
        false => attn("v_proj"),
    };
    // Each KV head's rows `repeat` times over.
    let kv_part = |name: &str| ld.repeated_heads(name, (kv, hd, repeat), h, spec.qkv_bias);
    let q = ld.matrix(&attn("q_proj.weight"), heads * hd, h)?;
    let mut bias = match spec.qkv_bias {
        true => ld.f32s(&attn("q_proj.bias"), &[heads * hd])?,
        false => Vec::new(),
    };
    let shared_kv = g.kv_from[i].is_some();
    let mut mats = vec![q];
    // transformers builds no k / v projections or norms for a sharing layer.
    let k_norm = match shared_kv {
        true => None,
        false => {
            let (k, kb) = kv_part(&attn("k_proj"))?;
            let (v, vb) = kv_part(&v_name)?;
            bias.extend(kb.into_iter().chain(vb));
            mats.extend([k, v]);
            Some(ld.vector(&attn("k_norm.weight"), hd)?)
        }
    };
    let qkv = HostMatrix::stack(mats).map_err(ModelError::Device)?;
    let qkv = ld.dev.linear(qkv, spec.qkv_bias.then_some(bias))?;
    let rope = (if sliding { g.local_rope } else { g.global_rope }).table(hd);
    Ok(Attention {
        qk_norm: Some((ld.vector(&attn("q_norm.weight"), hd)?, k_norm)),
        v_norm: Some(ld.dev.vector(&vec![1.0; hd])?),
        rope: Some((ld.dev.rope_table(&rope)?, hd)),
        heads,
        kv_heads: kv * repeat,
        head_dim: hd,
        shared_kv,
        variant: SoftmaxVariant {
            window: sliding.then_some(g.window),
            // transformers' `scaling` 1: the scores unscaled, head_dim^-½ undone.
            score_factor: (hd as f64).sqrt(),
            ..SoftmaxVariant::causal()
        },
        ..Attention::plain(
            (
                qkv,
                ld.linear1(&attn("o_proj"), h, heads * hd, spec.o_bias)?,
            ),
            spec,
            g.kv_layer(i),
        )
    })
}

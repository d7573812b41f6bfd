//! Qwen3.5 (text) and Qwen3-Next on the CPU kernels: Gated DeltaNet layers and gated full
//! attention, zero-centred `(1 + w)` RMSNorms, a dense SiLU MLP (Qwen3.5) or a sparse MoE with
//! a shared expert (Qwen3-Next, per `decoder_sparse_step` / `mlp_only_layers`).
//!
//! Per layer: `x += mixer(norm(x))`, `x += mlp(norm(x))` with plain adds, so a captured row is
//! the residual stream. Gated DeltaNet: one fused projection `[q k v | z | b | a]` (Qwen3-Next's
//! `in_proj_qkvz` / `in_proj_ba`, grouped per key head, are re-ordered into that layout at load),
//! causal conv + SiLU over q k v with the conv state of the request's slot, the gated delta rule
//! token by token (see `kernels::cpu::recurrent`), the per-head gated norm `w·norm(o)·silu(z)`,
//! then `out_proj`. Weights may sit under `model.` or (multimodal exports) `model.language_model.`.

use super::hybrid_attn::{AttnScratch, HybridAttention, kind_indices, load_linear, one_plus};
use super::hybrid_config::{GdnSpec, HybridSpec, LayerKind};
use super::moe::{GatedMlp, MoeBlock};
use super::{Architecture, ModelError, ModelSpec, Weights};
use crate::kernels::cpu::kv_cache::{BatchPlan, KvCache};
use crate::kernels::cpu::matmul::Linear;
use crate::kernels::cpu::ops;
use crate::kernels::cpu::recurrent::{
    GdnParams, SeqState, StateCache, causal_conv_silu, gated_delta_rule, gated_rms_norm_then_gate,
};

struct GdnLayer {
    /// `[q (nk·dk) | k (nk·dk) | v (nv·dv) | z (nv·dv) | b (nv) | a (nv)]` rows.
    in_proj: Linear,
    /// `[conv_dim, k]`.
    conv_w: Vec<f32>,
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    out_proj: Linear,
    state_index: usize,
}

enum Mixer {
    Gdn(GdnLayer),
    Attn(HybridAttention),
}

enum Ffn {
    Dense(GatedMlp),
    Moe(MoeBlock),
}

struct Layer {
    input_norm: Vec<f32>,
    mixer: Mixer,
    post_norm: Vec<f32>,
    ffn: Ffn,
}

/// Weights of a Qwen3.5 / Qwen3-Next text model, widened to f32.
pub struct QwenHybridModel {
    spec: ModelSpec,
    gdn: GdnSpec,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    /// `1 + w`.
    final_norm: Vec<f32>,
    lm_head: Option<Vec<f32>>,
    num_attn: usize,
}

#[derive(Default)]
struct Scratch {
    normed: Vec<f32>,
    proj: Vec<f32>,
    mixed: Vec<f32>,
    conv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    core: Vec<f32>,
    out: Vec<f32>,
    attn: AttnScratch,
}

impl QwenHybridModel {
    pub fn load(weights: &Weights, spec: ModelSpec) -> Result<Self, ModelError> {
        let hybrid = spec.hybrid.clone().expect("hybrid spec");
        let gdn = hybrid
            .gdn
            .clone()
            .expect("Qwen hybrids have Gated DeltaNet geometry");
        let prefix = if !weights.contains("model.embed_tokens.weight")
            && weights.contains("model.language_model.embed_tokens.weight")
        {
            "model.language_model"
        } else {
            "model"
        };
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        let embed = weights.tensor(&format!("{prefix}.embed_tokens.weight"), &[v, h])?;
        let (idx, num_attn, _) = kind_indices(&hybrid.layers);
        let layers = (0..spec.num_layers)
            .map(|i| load_layer(weights, &spec, &hybrid, &gdn, prefix, i, idx[i]))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = one_plus(weights.tensor(&format!("{prefix}.norm.weight"), &[h])?);
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(weights.tensor("lm_head.weight", &[v, h])?)
        };
        Ok(Self {
            spec,
            gdn,
            embed,
            layers,
            final_norm,
            lm_head,
            num_attn,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Attention layers (the KV cache holds only these).
    pub fn num_attention_layers(&self) -> usize {
        self.num_attn
    }

    pub fn kv_dim(&self) -> usize {
        self.spec.num_kv_heads * self.spec.head_dim
    }

    /// `(conv floats, recurrent floats)` per slot of each Gated DeltaNet layer.
    pub fn state_shapes(&self) -> Vec<(usize, usize)> {
        let g = &self.gdn;
        let n = self
            .layers
            .iter()
            .filter(|l| matches!(l.mixer, Mixer::Gdn(_)))
            .count();
        vec![
            (
                (g.conv_kernel - 1) * g.conv_dim(),
                g.num_v_heads * g.k_head_dim * g.v_head_dim
            );
            n
        ]
    }

    pub fn final_norm(&self, x: &[f32]) -> Vec<f32> {
        super::head::final_norm(x, &self.final_norm, self.spec.rms_norm_eps)
    }

    pub fn greedy(&self, rows: &[f32], threads: usize) -> Vec<u32> {
        let head = self.lm_head.as_deref();
        super::head::greedy(
            &self.spec,
            rows,
            &self.final_norm,
            head,
            &self.embed,
            threads,
        )
    }

    /// Runs every layer; `capture(id, x)` sees the residual stream for ids 0..=L. Returns the
    /// last layer's (pre-norm) output. Fresh chunks' state slots must already be zeroed.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        tokens: &[u32],
        plan: &BatchPlan<'_>,
        seqs: &[SeqState],
        cache: &mut KvCache,
        states: &mut StateCache,
        threads: usize,
        capture: &mut dyn FnMut(usize, &[f32]),
    ) -> Vec<f32> {
        let h = self.spec.hidden_size;
        let eps = self.spec.rms_norm_eps;
        let t = tokens.len();
        let mut x = super::head::embed_tokens(&self.embed, h, tokens);
        capture(0, &x);
        let mut s = Scratch::default();
        for (i, layer) in self.layers.iter().enumerate() {
            ops::rms_norm(&x, &layer.input_norm, eps, &mut s.normed);
            match &layer.mixer {
                Mixer::Gdn(g) => self.gdn_forward(g, seqs, states, threads, &mut s),
                Mixer::Attn(a) => {
                    a.forward(&s.normed, plan, cache, threads, &mut s.attn, &mut s.out)
                }
            }
            ops::add_inplace(&mut x, &s.out);
            ops::rms_norm(&x, &layer.post_norm, eps, &mut s.normed);
            match &layer.ffn {
                Ffn::Dense(m) => m.forward(&s.normed, t, threads, &mut s.out),
                Ffn::Moe(m) => m.forward(&s.normed, threads, &mut s.out),
            }
            ops::add_inplace(&mut x, &s.out);
            capture(i + 1, &x);
        }
        x
    }

    /// Gated DeltaNet on `s.normed`, result in `s.out`.
    fn gdn_forward(
        &self,
        g: &GdnLayer,
        seqs: &[SeqState],
        states: &mut StateCache,
        threads: usize,
        s: &mut Scratch,
    ) {
        let spec = &self.gdn;
        let t = s.normed.len() / self.spec.hidden_size;
        let (conv_dim, vd, nv) = (spec.conv_dim(), spec.value_dim(), spec.num_v_heads);
        g.in_proj.forward(&s.normed, t, &mut s.proj, threads);
        s.mixed.clear();
        s.z.clear();
        s.b.clear();
        s.a.clear();
        for row in s.proj.chunks_exact(conv_dim + vd + 2 * nv) {
            s.mixed.extend_from_slice(&row[..conv_dim]);
            s.z.extend_from_slice(&row[conv_dim..conv_dim + vd]);
            s.b.extend_from_slice(&row[conv_dim + vd..conv_dim + vd + nv]);
            s.a.extend_from_slice(&row[conv_dim + vd + nv..]);
        }
        let st = states.layer_mut(g.state_index);
        causal_conv_silu(
            &s.mixed,
            conv_dim,
            &g.conv_w,
            None,
            spec.conv_kernel,
            seqs,
            &mut st.conv,
            &mut s.conv,
        );
        let params = GdnParams {
            nk: spec.num_k_heads,
            nv,
            dk: spec.k_head_dim,
            dv: spec.v_head_dim,
            neg_a: &g.neg_a,
            dt_bias: &g.dt_bias,
        };
        gated_delta_rule(&s.conv, &s.b, &s.a, &params, seqs, &mut st.ssm, &mut s.core);
        gated_rms_norm_then_gate(&mut s.core, &s.z, &g.norm, self.spec.rms_norm_eps);
        g.out_proj.forward(&s.core, t, &mut s.out, threads);
    }
}

#[allow(clippy::too_many_arguments)]
fn load_layer(
    w: &Weights,
    spec: &ModelSpec,
    hybrid: &HybridSpec,
    gdn: &GdnSpec,
    prefix: &str,
    i: usize,
    kind_index: usize,
) -> Result<Layer, ModelError> {
    let p = format!("{prefix}.layers.{i}");
    let h = spec.hidden_size;
    let mixer = match hybrid.layers[i] {
        LayerKind::GatedDeltaNet => Mixer::Gdn(load_gdn(
            w,
            &format!("{p}.linear_attn"),
            spec,
            gdn,
            kind_index,
        )?),
        LayerKind::Attention => Mixer::Attn(HybridAttention::load_gated(
            w,
            &format!("{p}.self_attn"),
            spec,
            hybrid.rotary_dim,
            kind_index,
        )?),
        other => {
            return Err(ModelError::Unsupported {
                path: w.dir().join("config.json"),
                what: format!("layer {i} of kind {other:?} in a Qwen3.5 / Qwen3-Next model"),
            });
        }
    };
    let ffn = match &hybrid.moe {
        Some(m) if m.sparse_layers[i] => Ffn::Moe(MoeBlock::load(w, &format!("{p}.mlp"), h, m)?),
        _ => Ffn::Dense(GatedMlp::load(
            w,
            &format!("{p}.mlp"),
            h,
            spec.intermediate_size,
        )?),
    };
    Ok(Layer {
        input_norm: one_plus(w.tensor(&format!("{p}.input_layernorm.weight"), &[h])?),
        mixer,
        post_norm: one_plus(w.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?),
        ffn,
    })
}

fn load_gdn(
    w: &Weights,
    p: &str,
    spec: &ModelSpec,
    g: &GdnSpec,
    state_index: usize,
) -> Result<GdnLayer, ModelError> {
    let h = spec.hidden_size;
    let (kd, vd, nv, k) = (g.key_dim(), g.value_dim(), g.num_v_heads, g.conv_kernel);
    let conv_dim = g.conv_dim();
    let in_proj = if spec.architecture == Architecture::Qwen3Next {
        let qkvz = load_linear(w, &format!("{p}.in_proj_qkvz"), 2 * kd + 2 * vd, h, false)?;
        let ba = load_linear(w, &format!("{p}.in_proj_ba"), 2 * nv, h, false)?;
        next_to_fused(&qkvz, &ba, g)
    } else {
        Linear::concat(vec![
            load_linear(w, &format!("{p}.in_proj_qkv"), conv_dim, h, false)?,
            load_linear(w, &format!("{p}.in_proj_z"), vd, h, false)?,
            load_linear(w, &format!("{p}.in_proj_b"), nv, h, false)?,
            load_linear(w, &format!("{p}.in_proj_a"), nv, h, false)?,
        ])
    };
    let a_log = w.tensor(&format!("{p}.A_log"), &[nv])?;
    Ok(GdnLayer {
        in_proj,
        conv_w: w.tensor(&format!("{p}.conv1d.weight"), &[conv_dim, 1, k])?,
        neg_a: a_log.iter().map(|&v| -v.exp()).collect(),
        dt_bias: w.tensor(&format!("{p}.dt_bias"), &[nv])?,
        norm: w.tensor(&format!("{p}.norm.weight"), &[g.v_head_dim])?,
        out_proj: load_linear(w, &format!("{p}.out_proj"), h, vd, false)?,
        state_index,
    })
}

/// Qwen3-Next's projections are grouped per key head — `in_proj_qkvz` rows
/// `[q(dk) | k(dk) | v(r·dv) | z(r·dv)]` and `in_proj_ba` rows `[b(r) | a(r)]` for each key head,
/// r = nv / nk (transformers `fix_query_key_value_ordering`) — re-ordered here into the Qwen3.5
/// layout `[q | k | v | z | b | a]` (all heads of each part in head order).
fn next_to_fused(qkvz: &Linear, ba: &Linear, g: &GdnSpec) -> Linear {
    Linear {
        w: next_to_fused_rows(&qkvz.w, &ba.w, g, qkvz.inp),
        b: None,
        out: qkvz.out + ba.out,
        inp: qkvz.inp,
    }
}

/// [`next_to_fused`] on the row-major weights (`inp` columns), for the CUDA backend too.
pub(crate) fn next_to_fused_rows(qkvz: &[f32], ba: &[f32], g: &GdnSpec, inp: usize) -> Vec<f32> {
    let (dk, dv, nk) = (g.k_head_dim, g.v_head_dim, g.num_k_heads);
    let r = g.num_v_heads / nk;
    let group = 2 * dk + 2 * r * dv;
    let rows = |w: &[f32], from: usize, n: usize| w[from * inp..(from + n) * inp].to_vec();
    let mut w = Vec::with_capacity(qkvz.len() + ba.len());
    // q, k, v, z parts: offsets inside a key-head group and their lengths
    for (off, len) in [
        (0, dk),
        (dk, dk),
        (2 * dk, r * dv),
        (2 * dk + r * dv, r * dv),
    ] {
        for kh in 0..nk {
            w.extend(rows(qkvz, kh * group + off, len));
        }
    }
    for off in [0, r] {
        for kh in 0..nk {
            w.extend(rows(ba, kh * 2 * r + off, r));
        }
    }
    w
}

//! The dense decoder (Llama / Qwen2 / Qwen3 / Mistral) on the CPU kernels.
//!
//! Per layer: RMSNorm -> fused q/k/v projection (+bias) -> [Qwen3: per-head RMSNorm of q, k]
//! -> RoPE -> write K/V to the paged cache -> causal GQA attention over the cache -> o_proj ->
//! residual add; RMSNorm -> fused gate/up -> SiLU·mul -> down -> residual add. The residual adds
//! are plain adds, so a captured row is exactly `hidden + residual`. The final norm is applied
//! only for the LM head.

use std::sync::Mutex;

use super::{ModelError, ModelSpec, Weights};
use crate::kernels::cpu::attention::{AttnShape, attention};
use crate::kernels::cpu::kv_cache::{BatchPlan, KvCache};
use crate::kernels::cpu::matmul::Linear;
use crate::kernels::cpu::ops::{self, Rope};

struct Layer {
    input_norm: Vec<f32>,
    /// q, k, v stacked: `[(heads + 2 * kv_heads) * head_dim, hidden]`.
    qkv: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Linear,
    post_norm: Vec<f32>,
    /// gate, up stacked: `[2 * intermediate, hidden]`.
    gate_up: Linear,
    down: Linear,
}

/// Weights of a dense decoder, widened to f32.
pub struct DenseModel {
    spec: ModelSpec,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    /// `None` when tied to `embed`.
    lm_head: Option<Vec<f32>>,
    rope: Rope,
    /// Activation buffers kept between forwards: a step's buffers are tens of MB, and fresh
    /// ones would be page-faulted and zeroed again on every step.
    scratch: Mutex<Scratch>,
}

/// Scratch buffers of one forward, reused across layers.
#[derive(Default)]
struct Scratch {
    normed: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
}

impl DenseModel {
    /// Loads every tensor of `spec` from `weights`, checking names and shapes.
    pub fn load(weights: &Weights, spec: ModelSpec) -> Result<Self, ModelError> {
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        let embed = weights.tensor("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..spec.num_layers)
            .map(|i| load_layer(weights, &spec, i))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = weights.tensor("model.norm.weight", &[h])?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(weights.tensor("lm_head.weight", &[v, h])?)
        };
        let rope = Rope::new(spec.head_dim, spec.rope_theta, spec.rope_scaling);
        Ok(Self {
            spec,
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            scratch: Mutex::default(),
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Floats per KV cache slot of one layer (`kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.spec.num_kv_heads * self.spec.head_dim
    }

    /// The final RMSNorm applied to every `hidden`-wide row of `x` (id L -> HF's post-norm
    /// last hidden state).
    pub fn final_norm(&self, x: &[f32]) -> Vec<f32> {
        super::head::final_norm(x, &self.final_norm, self.spec.rms_norm_eps)
    }

    /// Runs all layers over the planned batch. `capture(id, x)` is called with the residual
    /// stream `[T, hidden]` for every layer id 0..=L in order. Returns the last layer's output
    /// (pre-norm). Must run inside the rayon pool that `threads` describes.
    pub fn forward(
        &self,
        tokens: &[u32],
        plan: &BatchPlan<'_>,
        cache: &mut KvCache,
        threads: usize,
        capture: &mut dyn FnMut(usize, &[f32]),
    ) -> Vec<f32> {
        let h = self.spec.hidden_size;
        let mut x = super::head::embed_tokens(&self.embed, h, tokens);
        capture(0, &x);
        // Forwards are serialised by `&mut KvCache`; a poisoned lock only means an earlier
        // forward panicked mid-way, and every buffer is overwritten before it is read.
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *guard;
        for (i, layer) in self.layers.iter().enumerate() {
            self.attention_block(i, layer, &mut x, plan, cache, threads, s);
            self.mlp_block(layer, &mut x, threads, s);
            capture(i + 1, &x);
        }
        x
    }

    /// Greedy token of each given pre-norm last-layer row (`[n, hidden]`).
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

    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        index: usize,
        layer: &Layer,
        x: &mut [f32],
        plan: &BatchPlan<'_>,
        cache: &mut KvCache,
        threads: usize,
        s: &mut Scratch,
    ) {
        let spec = &self.spec;
        let t = plan.num_tokens();
        let eps = spec.rms_norm_eps;
        ops::rms_norm(x, &layer.input_norm, eps, &mut s.normed);
        layer.qkv.forward(&s.normed, t, &mut s.qkv, threads);
        let (qd, kvd) = (spec.num_heads * spec.head_dim, self.kv_dim());
        split_qkv(&s.qkv, qd, kvd, &mut s.q, &mut s.k, &mut s.v);
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            ops::rms_norm_inplace(&mut s.q, qn, eps);
            ops::rms_norm_inplace(&mut s.k, kn, eps);
        }
        self.rope.apply(&mut s.q, &plan.positions, spec.num_heads);
        self.rope
            .apply(&mut s.k, &plan.positions, spec.num_kv_heads);
        cache.write(index, &plan.slots, &s.k, &s.v);
        let (kc, vc) = cache.layer(index);
        let shape = AttnShape {
            heads: spec.num_heads,
            kv_heads: spec.num_kv_heads,
            head_dim: spec.head_dim,
            scale: (spec.head_dim as f64).powf(-0.5) as f32,
        };
        attention(&s.q, kc, vc, plan, shape, &mut s.attn);
        layer.o.forward(&s.attn, t, &mut s.proj, threads);
        ops::add_inplace(x, &s.proj);
    }

    fn mlp_block(&self, layer: &Layer, x: &mut [f32], threads: usize, s: &mut Scratch) {
        let t = x.len() / self.spec.hidden_size;
        ops::rms_norm(x, &layer.post_norm, self.spec.rms_norm_eps, &mut s.normed);
        layer.gate_up.forward(&s.normed, t, &mut s.gate_up, threads);
        ops::silu_mul(&s.gate_up, self.spec.intermediate_size, &mut s.act);
        layer.down.forward(&s.act, t, &mut s.proj, threads);
        ops::add_inplace(x, &s.proj);
    }
}

/// Splits `[T, qd + 2 kvd]` rows into q `[T, qd]`, k and v `[T, kvd]`.
fn split_qkv(
    qkv: &[f32],
    qd: usize,
    kvd: usize,
    q: &mut Vec<f32>,
    k: &mut Vec<f32>,
    v: &mut Vec<f32>,
) {
    q.clear();
    k.clear();
    v.clear();
    for row in qkv.chunks_exact(qd + 2 * kvd) {
        q.extend_from_slice(&row[..qd]);
        k.extend_from_slice(&row[qd..qd + kvd]);
        v.extend_from_slice(&row[qd + kvd..]);
    }
}

fn load_linear(
    w: &Weights,
    name: &str,
    out: usize,
    inp: usize,
    bias: bool,
) -> Result<Linear, ModelError> {
    let weight = w.tensor(&format!("{name}.weight"), &[out, inp])?;
    let b = if bias {
        Some(w.tensor(&format!("{name}.bias"), &[out])?)
    } else {
        None
    };
    Ok(Linear {
        w: weight,
        b,
        out,
        inp,
    })
}

fn load_layer(w: &Weights, spec: &ModelSpec, i: usize) -> Result<Layer, ModelError> {
    let p = format!("model.layers.{i}");
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd, inter) = (
        spec.num_heads * hd,
        spec.num_kv_heads * hd,
        spec.intermediate_size,
    );
    let attn = |n: &str| format!("{p}.self_attn.{n}");
    let mlp = |n: &str| format!("{p}.mlp.{n}");
    let qkv = Linear::concat(vec![
        load_linear(w, &attn("q_proj"), qd, h, spec.qkv_bias)?,
        load_linear(w, &attn("k_proj"), kvd, h, spec.qkv_bias)?,
        load_linear(w, &attn("v_proj"), kvd, h, spec.qkv_bias)?,
    ]);
    let (q_norm, k_norm) = if spec.qk_norm {
        (
            Some(w.tensor(&attn("q_norm.weight"), &[hd])?),
            Some(w.tensor(&attn("k_norm.weight"), &[hd])?),
        )
    } else {
        (None, None)
    };
    let gate_up = Linear::concat(vec![
        load_linear(w, &mlp("gate_proj"), inter, h, spec.mlp_bias)?,
        load_linear(w, &mlp("up_proj"), inter, h, spec.mlp_bias)?,
    ]);
    Ok(Layer {
        input_norm: w.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
        qkv,
        q_norm,
        k_norm,
        o: load_linear(w, &attn("o_proj"), h, qd, spec.o_bias)?,
        post_norm: w.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
        gate_up,
        down: load_linear(w, &mlp("down_proj"), h, inter, spec.mlp_bias)?,
    })
}

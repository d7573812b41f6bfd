//! The dense decoder (Llama / Qwen2 / Qwen3 / Mistral) on the CUDA kernels, step for step as
//! src/models/dense.rs: RMSNorm -> fused qkv GEMM (+bias) -> [Qwen3: per-head q/k RMSNorm] ->
//! RoPE -> K/V into the paged cache -> causal GQA attention -> o_proj (+bias) -> residual add;
//! RMSNorm -> fused gate/up GEMM -> SiLU·mul -> down (+bias) -> residual add. Residual adds are
//! fused into the following RMSNorm (x += y first, exactly, then the norm), so a captured row is
//! still exactly `hidden + residual`; the final norm only feeds the LM head.
//!
//! The residual stream and every GEMM output are f32; GEMM inputs (normed rows, attention
//! output, SiLU·mul) are written in the weights' dtype.

use super::capture::Capture;
use super::context::{CudaResult, DevBuf, Gpu};
use super::gemm::linear;
use super::kv_cache::{AttnShape, DevKvCache, DevPlan};
use super::ops::{self, Heads};
use super::weights::{DevWeight, UploadError, upload_matrix, upload_stacked, upload_vector};
use crate::kernels::cpu::ops::Rope;
use crate::models::{ModelSpec, WeightDtype, Weights};

struct Layer {
    input_norm: DevBuf<f32>,
    qkv: DevWeight,
    qkv_bias: Option<DevBuf<f32>>,
    q_norm: Option<DevBuf<f32>>,
    k_norm: Option<DevBuf<f32>>,
    o: DevWeight,
    o_bias: Option<DevBuf<f32>>,
    post_norm: DevBuf<f32>,
    gate_up: DevWeight,
    gate_up_bias: Option<DevBuf<f32>>,
    down: DevWeight,
    down_bias: Option<DevBuf<f32>>,
}

/// Activation buffers for the token budget, allocated once.
struct Scratch {
    x: DevBuf<f32>,
    /// GEMM inputs (weights' dtype; f32-sized so any dtype fits).
    normed: DevBuf<f32>,
    attn: DevBuf<f32>,
    act: DevBuf<f32>,
    qkv: DevBuf<f32>,
    proj: DevBuf<f32>,
    gate_up: DevBuf<f32>,
}

/// A dense model's weights on the device.
pub struct DenseCuda {
    spec: ModelSpec,
    dtype: WeightDtype,
    embed: DevWeight,
    layers: Vec<Layer>,
    final_norm: DevBuf<f32>,
    lm_head: Option<DevWeight>,
    inv_freq: DevBuf<f32>,
    s: Scratch,
    max_tokens: usize,
}

impl DenseCuda {
    pub fn load(
        gpu: &Gpu,
        w: &Weights,
        spec: ModelSpec,
        max_tokens: usize,
    ) -> Result<Self, UploadError> {
        let (v, h, dt) = (spec.vocab_size, spec.hidden_size, spec.dtype);
        let embed = upload_matrix(gpu, w, "model.embed_tokens.weight", v, h, dt)?;
        let layers = (0..spec.num_layers)
            .map(|i| load_layer(gpu, w, &spec, i))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = upload_vector(gpu, w, &[("model.norm.weight".into(), h)])?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(upload_matrix(gpu, w, "lm_head.weight", v, h, dt)?)
        };
        let rope = Rope::new(spec.head_dim, spec.rope_theta, spec.rope_scaling);
        let inv_freq = gpu.upload(rope.inv_freq())?;
        let s = Scratch::new(gpu, &spec, max_tokens)?;
        Ok(Self {
            dtype: dt,
            spec,
            embed,
            layers,
            final_norm,
            lm_head,
            inv_freq,
            s,
            max_tokens,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn kv_dim(&self) -> usize {
        self.spec.num_kv_heads * self.spec.head_dim
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Runs every layer over the batch; captured layers go to `capture` (slot of each layer id
    /// in `slots`). Leaves the last layer's output (pre-norm) in the residual buffer.
    pub fn forward(
        &self,
        gpu: &Gpu,
        plan: &DevPlan,
        cache: &DevKvCache,
        capture: &Capture,
        slots: &[Option<usize>],
    ) -> CudaResult<()> {
        let t = plan.num_tokens;
        let (h, eps, s) = (self.spec.hidden_size, self.spec.rms_norm_eps, &self.s);
        s.x.check(t * h, "tokens beyond the budget")?;
        ops::embed(gpu, plan.tokens.ptr(), &self.embed, s.x.ptr(), t)?;
        let cap = |id: usize| match slots.get(id).copied().flatten() {
            Some(k) => capture.capture(gpu, k, s.x.ptr(), t),
            None => Ok(()),
        };
        cap(0)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                let (x, n) = (s.x.ptr(), s.normed.ptr());
                ops::rms_norm(gpu, x, layer.input_norm.ptr(), n, self.dtype, t, h, eps)?;
            } else {
                // Layer i-1's MLP residual add, fused with this layer's input norm.
                let w = layer.input_norm.ptr();
                ops::add_rms_norm(
                    gpu,
                    s.x.ptr(),
                    s.proj.ptr(),
                    w,
                    s.normed.ptr(),
                    self.dtype,
                    t,
                    h,
                    eps,
                )?;
                cap(i)?;
            }
            self.attention_block(gpu, i, layer, plan, cache)?;
            self.mlp_block(gpu, layer, t)?;
        }
        ops::add(gpu, s.x.ptr(), s.proj.ptr(), t * h)?;
        cap(self.layers.len())
    }

    fn attention_block(
        &self,
        gpu: &Gpu,
        index: usize,
        layer: &Layer,
        plan: &DevPlan,
        cache: &DevKvCache,
    ) -> CudaResult<()> {
        let (spec, s, t) = (&self.spec, &self.s, plan.num_tokens);
        let (hd, eps) = (spec.head_dim, spec.rms_norm_eps);
        let (qd, kvd) = (spec.num_heads * hd, self.kv_dim());
        let width = qd + 2 * kvd;
        linear(gpu, s.normed.ptr(), &layer.qkv, s.qkv.ptr(), t)?;
        if let Some(b) = &layer.qkv_bias {
            ops::bias_add(gpu, s.qkv.ptr(), b.ptr(), t, width)?;
        }
        let heads = |col: usize, heads: usize| Heads {
            base: s.qkv.ptr(),
            stride: width,
            col,
            rows: t,
            heads,
            head_dim: hd,
        };
        let (q, k) = (heads(0, spec.num_heads), heads(qd, spec.num_kv_heads));
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            ops::head_rms_norm(gpu, q, qn.ptr(), eps)?;
            ops::head_rms_norm(gpu, k, kn.ptr(), eps)?;
        }
        let (pos, inv) = (plan.positions.ptr(), self.inv_freq.ptr());
        ops::rope(gpu, q, hd, pos, inv)?;
        ops::rope(gpu, k, hd, pos, inv)?;
        cache.write(gpu, index, q, qd, qd + kvd, plan)?;
        let shape = AttnShape {
            heads: spec.num_heads,
            kv_heads: spec.num_kv_heads,
            head_dim: hd,
            scale: (hd as f64).powf(-0.5) as f32,
        };
        cache.attention(gpu, index, q, shape, s.attn.ptr(), self.dtype, plan)?;
        linear(gpu, s.attn.ptr(), &layer.o, s.proj.ptr(), t)?;
        if let Some(b) = &layer.o_bias {
            ops::bias_add(gpu, s.proj.ptr(), b.ptr(), t, spec.hidden_size)?;
        }
        let w = layer.post_norm.ptr();
        let n = spec.hidden_size;
        ops::add_rms_norm(
            gpu,
            s.x.ptr(),
            s.proj.ptr(),
            w,
            s.normed.ptr(),
            self.dtype,
            t,
            n,
            eps,
        )
    }

    fn mlp_block(&self, gpu: &Gpu, layer: &Layer, t: usize) -> CudaResult<()> {
        let (s, inter) = (&self.s, self.spec.intermediate_size);
        linear(gpu, s.normed.ptr(), &layer.gate_up, s.gate_up.ptr(), t)?;
        if let Some(b) = &layer.gate_up_bias {
            ops::bias_add(gpu, s.gate_up.ptr(), b.ptr(), t, 2 * inter)?;
        }
        ops::silu_mul(gpu, s.gate_up.ptr(), s.act.ptr(), self.dtype, t, inter)?;
        linear(gpu, s.act.ptr(), &layer.down, s.proj.ptr(), t)?;
        if let Some(b) = &layer.down_bias {
            ops::bias_add(gpu, s.proj.ptr(), b.ptr(), t, self.spec.hidden_size)?;
        }
        Ok(())
    }

    /// Greedy tokens of residual rows `rows` (device u32 indices, `n` of them) of the last
    /// forward: final norm, LM head, argmax. Waits for the compute stream.
    pub fn greedy(&self, gpu: &Gpu, rows: &DevBuf<u32>, n: usize) -> CudaResult<Vec<u32>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let (h, v) = (self.spec.hidden_size, self.spec.vocab_size);
        let last: DevBuf<f32> = gpu.zeros(n * h)?;
        let normed: DevBuf<f32> = gpu.zeros(n * h)?;
        let logits: DevBuf<f32> = gpu.zeros(n * v)?;
        let out: DevBuf<u32> = gpu.zeros(n)?;
        ops::gather_rows(gpu, self.s.x.ptr(), rows.ptr(), last.ptr(), n, h)?;
        let eps = self.spec.rms_norm_eps;
        ops::rms_norm(
            gpu,
            last.ptr(),
            self.final_norm.ptr(),
            normed.ptr(),
            self.dtype,
            n,
            h,
            eps,
        )?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        linear(gpu, normed.ptr(), head, logits.ptr(), n)?;
        ops::argmax(gpu, logits.ptr(), n, v, out.ptr())?;
        gpu.download(&out, n)
    }
}

impl Scratch {
    fn new(gpu: &Gpu, spec: &ModelSpec, t: usize) -> CudaResult<Self> {
        let (h, hd) = (spec.hidden_size, spec.head_dim);
        let (qd, kvd, inter) = (
            spec.num_heads * hd,
            spec.num_kv_heads * hd,
            spec.intermediate_size,
        );
        Ok(Self {
            x: gpu.zeros(t * h)?,
            normed: gpu.zeros(t * h)?,
            attn: gpu.zeros(t * qd)?,
            act: gpu.zeros(t * inter)?,
            qkv: gpu.zeros(t * (qd + 2 * kvd))?,
            proj: gpu.zeros(t * h)?,
            gate_up: gpu.zeros(t * 2 * inter)?,
        })
    }
}

fn load_layer(gpu: &Gpu, w: &Weights, spec: &ModelSpec, i: usize) -> Result<Layer, UploadError> {
    let p = format!("model.layers.{i}");
    let (h, hd, dt) = (spec.hidden_size, spec.head_dim, spec.dtype);
    let (qd, kvd, inter) = (
        spec.num_heads * hd,
        spec.num_kv_heads * hd,
        spec.intermediate_size,
    );
    let attn = |n: &str, r: usize| (format!("{p}.self_attn.{n}"), r);
    let mlp = |n: &str, r: usize| (format!("{p}.mlp.{n}"), r);
    let with = |parts: &[(String, usize)], suffix: &str| -> Vec<(String, usize)> {
        parts
            .iter()
            .map(|(n, r)| (format!("{n}.{suffix}"), *r))
            .collect()
    };
    let bias = |on: bool, parts: &[(String, usize)]| -> Result<Option<DevBuf<f32>>, UploadError> {
        if on {
            Ok(Some(upload_vector(gpu, w, &with(parts, "bias"))?))
        } else {
            Ok(None)
        }
    };
    let qkv_parts = [attn("q_proj", qd), attn("k_proj", kvd), attn("v_proj", kvd)];
    let o_parts = [attn("o_proj", h)];
    let gu_parts = [mlp("gate_proj", inter), mlp("up_proj", inter)];
    let down_parts = [mlp("down_proj", h)];
    let norm = |name: String, n: usize| upload_vector(gpu, w, &[(name, n)]);
    let (q_norm, k_norm) = if spec.qk_norm {
        (
            Some(norm(format!("{p}.self_attn.q_norm.weight"), hd)?),
            Some(norm(format!("{p}.self_attn.k_norm.weight"), hd)?),
        )
    } else {
        (None, None)
    };
    Ok(Layer {
        input_norm: norm(format!("{p}.input_layernorm.weight"), h)?,
        qkv: upload_stacked(gpu, w, &with(&qkv_parts, "weight"), h, dt)?,
        qkv_bias: bias(spec.qkv_bias, &qkv_parts)?,
        q_norm,
        k_norm,
        o: upload_stacked(gpu, w, &with(&o_parts, "weight"), qd, dt)?,
        o_bias: bias(spec.o_bias, &o_parts)?,
        post_norm: norm(format!("{p}.post_attention_layernorm.weight"), h)?,
        gate_up: upload_stacked(gpu, w, &with(&gu_parts, "weight"), h, dt)?,
        gate_up_bias: bias(spec.mlp_bias, &gu_parts)?,
        down: upload_stacked(gpu, w, &with(&down_parts, "weight"), inter, dt)?,
        down_bias: bias(spec.mlp_bias, &down_parts)?,
    })
}

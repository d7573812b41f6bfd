//! The dense decoder (Llama / Qwen2 / Qwen3 / Mistral) on the CUDA kernels, step for step as
//! src/models/dense.rs: RMSNorm -> fused qkv GEMM (+bias) -> [Qwen3: per-head q/k RMSNorm] ->
//! RoPE -> K/V into the paged cache -> causal GQA attention -> o_proj (+bias) -> residual add;
//! RMSNorm -> fused gate/up GEMM -> SiLU·mul -> down (+bias) -> residual add. Residual adds are
//! fused into the following RMSNorm (x += y first, exactly, then the norm), so a captured row is
//! still exactly `hidden + residual`; the final norm only feeds the LM head.
//!
//! The residual stream and every GEMM output are f32; GEMM inputs (normed rows, attention
//! output, SiLU·mul) are written in the weights' dtype.

use super::api::CudaOptions;
use super::backend::{DevModel, residual_stream};
use super::context::{CudaResult, DevBuf, Gpu};
use super::gemm::linear;
use super::kv_cache::{DevKvCache, DevPlan, QkvRows};
use super::ops;
use super::weights::{DevWeight, UploadError, upload_matrix, upload_stacked, upload_vector};
use crate::kernels::cpu::ops::Rope;
use crate::kernels::{BackendError, Batch};
use crate::models::{ModelError, ModelSpec, WeightDtype, Weights};

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
}

impl DenseCuda {
    pub fn load(
        gpu: &Gpu,
        w: &Weights,
        spec: ModelSpec,
        opts: &CudaOptions,
    ) -> Result<Self, ModelError> {
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
        let s = Scratch::new(gpu, &spec, opts.max_num_batched_tokens)?;
        Ok(Self {
            dtype: dt,
            spec,
            embed,
            layers,
            final_norm,
            lm_head,
            inv_freq,
            s,
        })
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
        let qd = spec.num_heads * hd;
        let width = qd + 2 * spec.num_kv_heads * hd;
        linear(gpu, s.normed.ptr(), &layer.qkv, s.qkv.ptr(), t)?;
        if let Some(b) = &layer.qkv_bias {
            ops::bias_add(gpu, s.qkv.ptr(), b.ptr(), t, width)?;
        }
        let rows = QkvRows {
            base: s.qkv.ptr(),
            width,
            k_col: qd,
            heads: spec.num_heads,
            kv_heads: spec.num_kv_heads,
            head_dim: hd,
        };
        let norms = (layer.q_norm.as_ref())
            .zip(layer.k_norm.as_ref())
            .map(|(q, k)| (q.ptr(), k.ptr(), eps));
        let rope = Some((hd, self.inv_freq.ptr()));
        let out = (s.attn.ptr(), self.dtype);
        cache.attend(gpu, index, rows, norms, rope, out, plan)?;
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
}

impl DevModel for DenseCuda {
    type Seqs = ();

    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn kv_shape(&self) -> (usize, usize) {
        let s = &self.spec;
        (s.num_layers, s.num_kv_heads * s.head_dim)
    }

    fn residual(&self) -> &DevBuf<f32> {
        &self.s.x
    }

    fn head(&self) -> (&DevBuf<f32>, &DevWeight) {
        (
            &self.final_norm,
            self.lm_head.as_ref().unwrap_or(&self.embed),
        )
    }

    fn seqs(&self, _: &Batch<'_>) -> Result<(), BackendError> {
        Ok(())
    }

    fn forward(
        &self,
        gpu: &Gpu,
        plan: &DevPlan,
        _: &(),
        cache: &DevKvCache,
        cap: &dyn Fn(usize) -> CudaResult<()>,
    ) -> CudaResult<()> {
        let (s, layers) = (&self.s, &self.layers);
        let stream = (&s.x, &s.normed, &s.proj);
        let norm = |l: &Layer| l.input_norm.ptr();
        residual_stream(
            gpu,
            &self.spec,
            &self.embed,
            plan,
            stream,
            layers,
            norm,
            cap,
            |i, l| {
                self.attention_block(gpu, i, l, plan, cache)?;
                self.mlp_block(gpu, l, plan.num_tokens)
            },
        )
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

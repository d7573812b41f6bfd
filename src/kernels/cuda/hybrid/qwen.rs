//! Qwen3.5 / Qwen3-Next on the CUDA kernels, step for step as models::qwen3_5: per layer
//! `x += mixer(norm(x))`, `x += mlp(norm(x))` with zero-centred `(1 + w)` RMSNorms (the adds
//! fused into the following norm, kept exact in f32, so a captured row is the residual stream).
//!
//! Gated DeltaNet: one fused projection `[q k v | z | b | a]` (Qwen3-Next's per-key-head
//! grouped `in_proj_qkvz` / `in_proj_ba` re-ordered into that layout at load), causal conv +
//! SiLU with the slot's conv state, l2norm of q / k, the gated delta rule token by token
//! (gated_delta.cu), the per-head gated norm `w·norm(o)·silu(z)`, then `out_proj`.

use super::super::context::{CudaError, CudaResult, DevBuf, Gpu};
use super::super::gemm::linear;
use super::super::ops;
use super::super::weights::{DevWeight, UploadError, upload_as, upload_stacked};
use super::attn::{HybridAttnDev, matrix, one_plus};
use super::moe::{MoeDev, MoeScratch};
use super::recurrent::{self, ConvIo, GatedNormIo, GdnIo};
use super::{Step, Widths};
use crate::models::hybrid_attn::kind_indices;
use crate::models::hybrid_config::{GdnSpec, LayerKind};
use crate::models::qwen3_5::next_to_fused_rows;
use crate::models::{Architecture, ModelError, ModelSpec, Weights};

struct GdnDev {
    /// `[q | k | v | z | b | a]` rows.
    in_proj: DevWeight,
    /// `[conv_dim, k]`.
    conv_w: DevBuf<f32>,
    neg_a: DevBuf<f32>,
    dt_bias: DevBuf<f32>,
    norm: DevBuf<f32>,
    out_proj: DevWeight,
    state_index: usize,
}

enum Mixer {
    Gdn(GdnDev),
    Attn(HybridAttnDev),
}

enum Ffn {
    Dense { gate_up: DevWeight, down: DevWeight },
    Moe(Box<MoeDev>),
}

struct Layer {
    input_norm: DevBuf<f32>,
    mixer: Mixer,
    post_norm: DevBuf<f32>,
    ffn: Ffn,
}

/// A Qwen3.5 / Qwen3-Next text model on the device.
pub struct QwenCuda {
    pub(super) spec: ModelSpec,
    gdn: GdnSpec,
    pub(super) embed: DevWeight,
    layers: Vec<Layer>,
    /// `1 + w`.
    pub(super) final_norm: DevBuf<f32>,
    pub(super) lm_head: Option<DevWeight>,
    pub(super) num_attn: usize,
    pub(super) num_rec: usize,
    moe: Option<MoeScratch>,
}

impl QwenCuda {
    pub fn load(
        gpu: &Gpu,
        w: &Weights,
        spec: ModelSpec,
        max_tokens: usize,
    ) -> Result<Self, UploadError> {
        let hybrid = spec
            .hybrid
            .clone()
            .ok_or_else(|| missing(&spec, "hybrid"))?;
        let gdn = hybrid.gdn.clone().ok_or_else(|| missing(&spec, "gdn"))?;
        let prefix = if !w.contains("model.embed_tokens.weight")
            && w.contains("model.language_model.embed_tokens.weight")
        {
            "model.language_model"
        } else {
            "model"
        };
        let (v, h, dt) = (spec.vocab_size, spec.hidden_size, spec.dtype);
        let embed = matrix(gpu, w, &format!("{prefix}.embed_tokens.weight"), v, h, dt)?;
        let (idx, num_attn, num_rec) = kind_indices(&hybrid.layers);
        let mut layers = Vec::with_capacity(spec.num_layers);
        for (i, &kind) in hybrid.layers.iter().enumerate() {
            let p = format!("{prefix}.layers.{i}");
            let mixer = match kind {
                LayerKind::GatedDeltaNet => Mixer::Gdn(load_gdn(
                    gpu,
                    w,
                    &format!("{p}.linear_attn"),
                    &spec,
                    &gdn,
                    idx[i],
                )?),
                LayerKind::Attention => Mixer::Attn(HybridAttnDev::load_gated(
                    gpu,
                    w,
                    &format!("{p}.self_attn"),
                    &spec,
                    hybrid.rotary_dim,
                    idx[i],
                )?),
                other => {
                    return Err(ModelError::Unsupported {
                        path: w.dir().join("config.json"),
                        what: format!(
                            "layer {i} of kind {other:?} in a Qwen3.5 / Qwen3-Next model"
                        ),
                    }
                    .into());
                }
            };
            let ffn = match &hybrid.moe {
                Some(m) if m.sparse_layers[i] => Ffn::Moe(Box::new(MoeDev::load(
                    gpu,
                    w,
                    &format!("{p}.mlp"),
                    h,
                    m,
                    dt,
                )?)),
                _ => {
                    let inter = spec.intermediate_size;
                    let part = |s: &str| (format!("{p}.mlp.{s}.weight"), inter);
                    Ffn::Dense {
                        gate_up: upload_stacked(
                            gpu,
                            w,
                            &[part("gate_proj"), part("up_proj")],
                            h,
                            dt,
                        )?,
                        down: matrix(gpu, w, &format!("{p}.mlp.down_proj.weight"), h, inter, dt)?,
                    }
                }
            };
            let norm = |n: &str| -> Result<DevBuf<f32>, UploadError> {
                Ok(gpu.upload(&one_plus(w.tensor(&format!("{p}.{n}.weight"), &[h])?))?)
            };
            layers.push(Layer {
                input_norm: norm("input_layernorm")?,
                mixer,
                post_norm: norm("post_attention_layernorm")?,
                ffn,
            });
        }
        let final_norm =
            gpu.upload(&one_plus(w.tensor(&format!("{prefix}.norm.weight"), &[h])?))?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(matrix(gpu, w, "lm_head.weight", v, h, dt)?)
        };
        let moe = match &hybrid.moe {
            Some(m) if m.sparse_layers.iter().any(|&s| s) => {
                Some(MoeScratch::new(gpu, m, h, max_tokens)?)
            }
            _ => None,
        };
        Ok(Self {
            spec,
            gdn,
            embed,
            layers,
            final_norm,
            lm_head,
            num_attn,
            num_rec,
            moe,
        })
    }

    /// `(conv floats, recurrent floats)` per slot of each Gated DeltaNet layer.
    pub fn state_shape(&self) -> (usize, usize) {
        let g = &self.gdn;
        (
            (g.conv_kernel - 1) * g.conv_dim(),
            g.num_v_heads * g.k_head_dim * g.v_head_dim,
        )
    }

    /// Row widths of the shared activation buffers.
    pub fn widths(&self) -> Widths {
        let s = &self.spec;
        let g = &self.gdn;
        let (qd, kvd) = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
        let inter = s.intermediate_size;
        let proj = g.conv_dim() + g.value_dim() + 2 * g.num_v_heads;
        Widths {
            wide: proj.max(2 * qd + 2 * kvd).max(2 * inter),
            conv: g.conv_dim(),
            mid: g.value_dim().max(qd),
            act: g.value_dim().max(qd).max(inter),
        }
    }

    /// Runs every layer; `cap(id)` captures the residual stream `b.x` for ids 0..=L. Leaves the
    /// last layer's (pre-norm) output in `b.x`. Fresh slots must already be zeroed.
    pub fn forward(&self, s: &Step<'_>, cap: &dyn Fn(usize) -> CudaResult<()>) -> CudaResult<()> {
        let (gpu, b, plan) = (s.gpu, s.b, s.plan);
        let (t, h, eps, dt) = (
            plan.num_tokens,
            self.spec.hidden_size,
            self.spec.rms_norm_eps,
            self.spec.dtype,
        );
        let (normed, proj) = (b.normed.ptr(), b.proj.ptr());
        let norm = |l: &Layer| l.input_norm.ptr();
        let model = (&self.spec, &self.embed);
        s.run_blocks(model, &self.layers, norm, cap, |_, layer| {
            match &layer.mixer {
                Mixer::Gdn(g) => self.gdn_forward(s, g)?,
                Mixer::Attn(a) => a.forward(gpu, b, dt, plan, s.cache)?,
            }
            let w = layer.post_norm.ptr();
            ops::add_rms_norm(gpu, b.x.ptr(), proj, w, normed, dt, t, h, eps)?;
            match &layer.ffn {
                Ffn::Dense { gate_up, down } => {
                    let inter = self.spec.intermediate_size;
                    linear(gpu, normed, gate_up, b.wide.ptr(), t)?;
                    ops::silu_mul(gpu, b.wide.ptr(), b.act.ptr(), dt, t, inter)?;
                    linear(gpu, b.act.ptr(), down, proj, t)
                }
                Ffn::Moe(m) => {
                    let scratch = (self.moe.as_ref())
                        .ok_or_else(|| CudaError::Invalid("no MoE scratch".into()))?;
                    m.forward(gpu, normed, t, scratch, dt, proj)
                }
            }
        })
    }

    /// Gated DeltaNet on `b.normed`, result in `b.proj`.
    fn gdn_forward(&self, s: &Step<'_>, g: &GdnDev) -> CudaResult<()> {
        let (gpu, b, seqs, states) = (s.gpu, s.b, s.seqs, s.states);
        let spec = &self.gdn;
        let t = seqs.num_tokens;
        let (conv_dim, vd, nv) = (spec.conv_dim(), spec.value_dim(), spec.num_v_heads);
        let width = conv_dim + vd + 2 * nv;
        let proj = b.wide.ptr();
        linear(gpu, b.normed.ptr(), &g.in_proj, proj, t)?;
        let col = |c: usize| proj + (c * 4) as u64;
        recurrent::conv_silu(
            gpu,
            ConvIo {
                x: proj,
                stride: width,
                ch: conv_dim,
                k: spec.conv_kernel,
                w: g.conv_w.ptr(),
                bias: 0,
                state: states.conv(g.state_index)?,
                out: b.conv.ptr(),
            },
            seqs,
        )?;
        recurrent::gated_delta(
            gpu,
            GdnIo {
                nk: spec.num_k_heads,
                nv,
                dk: spec.k_head_dim,
                dv: spec.v_head_dim,
                qkv: b.conv.ptr(),
                b: col(conv_dim + vd),
                a: col(conv_dim + vd + nv),
                ba_stride: width,
                neg_a: g.neg_a.ptr(),
                dt_bias: g.dt_bias.ptr(),
                state: states.ssm(g.state_index)?,
                out: b.mid.ptr(),
            },
            seqs,
        )?;
        let norm = GatedNormIo {
            x: b.mid.ptr(),
            z: col(conv_dim),
            z_stride: width,
            w: g.norm.ptr(),
            out: b.act.ptr(),
            dtype: self.spec.dtype,
            t,
            eps: self.spec.rms_norm_eps,
        };
        recurrent::gdn_gated_norm(gpu, norm, nv, spec.v_head_dim)?;
        linear(gpu, b.act.ptr(), &g.out_proj, b.proj.ptr(), t)
    }
}

fn missing(spec: &ModelSpec, what: &str) -> UploadError {
    UploadError::Model(ModelError::InvalidOptions(format!(
        "{} spec without {what} geometry",
        spec.architecture.hf_name()
    )))
}

fn load_gdn(
    gpu: &Gpu,
    w: &Weights,
    p: &str,
    spec: &ModelSpec,
    g: &GdnSpec,
    state_index: usize,
) -> Result<GdnDev, UploadError> {
    let (h, dt) = (spec.hidden_size, spec.dtype);
    let (kd, vd, nv, k) = (g.key_dim(), g.value_dim(), g.num_v_heads, g.conv_kernel);
    let conv_dim = g.conv_dim();
    let rows = if spec.architecture == Architecture::Qwen3Next {
        let qkvz = w.tensor(&format!("{p}.in_proj_qkvz.weight"), &[2 * kd + 2 * vd, h])?;
        let ba = w.tensor(&format!("{p}.in_proj_ba.weight"), &[2 * nv, h])?;
        next_to_fused_rows(&qkvz, &ba, g, h)
    } else {
        let mut rows = w.tensor(&format!("{p}.in_proj_qkv.weight"), &[conv_dim, h])?;
        rows.extend(w.tensor(&format!("{p}.in_proj_z.weight"), &[vd, h])?);
        rows.extend(w.tensor(&format!("{p}.in_proj_b.weight"), &[nv, h])?);
        rows.extend(w.tensor(&format!("{p}.in_proj_a.weight"), &[nv, h])?);
        rows
    };
    let a_log = w.tensor(&format!("{p}.A_log"), &[nv])?;
    let neg_a: Vec<f32> = a_log.iter().map(|&v| -v.exp()).collect();
    Ok(GdnDev {
        in_proj: DevWeight {
            data: upload_as(gpu, &rows, dt)?,
            rows: conv_dim + vd + 2 * nv,
            cols: h,
        },
        conv_w: gpu.upload(&w.tensor(&format!("{p}.conv1d.weight"), &[conv_dim, 1, k])?)?,
        neg_a: gpu.upload(&neg_a)?,
        dt_bias: gpu.upload(&w.tensor(&format!("{p}.dt_bias"), &[nv])?)?,
        norm: gpu.upload(&w.tensor(&format!("{p}.norm.weight"), &[g.v_head_dim])?)?,
        out_proj: matrix(gpu, w, &format!("{p}.out_proj.weight"), h, vd, dt)?,
        state_index,
    })
}

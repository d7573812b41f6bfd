//! Nemotron-H on the CUDA kernels, step for step as models::nemotron_h: blocks
//! `x += mixer(norm(x))` (the add fused into the next block's norm, exact in f32), each mixer a
//! Mamba-2 layer, an attention layer (no RoPE, no bias) or an MLP `down(relu(up(x))²)`; every
//! block is a layer id.
//!
//! Mamba-2: `in_proj` -> `[z (inner) | xBC (conv_dim) | dt (heads)]`; causal conv + SiLU over
//! xBC with the slot's conv state; the selective scan token by token with `dt` clamped to
//! `time_step_min` (mamba2.cu); `y·silu(z)` then RMSNorm per group; `out_proj`.

use super::super::context::{CudaResult, DevBuf, Gpu};
use super::super::gemm::linear;
use super::super::ops;
use super::super::weights::{DevWeight, UploadError};
use super::attn::{HybridAttnDev, matrix};
use super::recurrent::{self, ConvIo, GatedNormIo, MambaIo};
use super::{Step, Widths};
use crate::models::hybrid_attn::kind_indices;
use crate::models::hybrid_config::{LayerKind, MambaSpec};
use crate::models::{ModelError, ModelSpec, Weights};

struct MambaDev {
    in_proj: DevWeight,
    in_bias: Option<DevBuf<f32>>,
    conv_w: DevBuf<f32>,
    conv_b: Option<DevBuf<f32>>,
    neg_a: DevBuf<f32>,
    d: DevBuf<f32>,
    dt_bias: DevBuf<f32>,
    norm: DevBuf<f32>,
    out_proj: DevWeight,
    out_bias: Option<DevBuf<f32>>,
    state_index: usize,
}

struct MlpDev {
    up: DevWeight,
    up_bias: Option<DevBuf<f32>>,
    down: DevWeight,
    down_bias: Option<DevBuf<f32>>,
}

enum Mixer {
    Mamba(MambaDev),
    Attn(HybridAttnDev),
    Mlp(MlpDev),
}

struct Block {
    norm: DevBuf<f32>,
    mixer: Mixer,
}

/// A Nemotron-H model on the device.
pub struct NemotronCuda {
    pub(super) spec: ModelSpec,
    mamba: MambaSpec,
    pub(super) embed: DevWeight,
    blocks: Vec<Block>,
    pub(super) final_norm: DevBuf<f32>,
    pub(super) lm_head: Option<DevWeight>,
    pub(super) num_attn: usize,
    pub(super) num_rec: usize,
}

impl NemotronCuda {
    pub fn load(gpu: &Gpu, w: &Weights, spec: ModelSpec) -> Result<Self, UploadError> {
        let hybrid = spec.hybrid.clone().ok_or_else(|| missing(&spec))?;
        let mamba = hybrid.mamba.clone().ok_or_else(|| missing(&spec))?;
        let (v, h, dt) = (spec.vocab_size, spec.hidden_size, spec.dtype);
        let embed = matrix(gpu, w, "backbone.embeddings.weight", v, h, dt)?;
        let (idx, num_attn, num_rec) = kind_indices(&hybrid.layers);
        let mut blocks = Vec::with_capacity(hybrid.layers.len());
        for (i, &kind) in hybrid.layers.iter().enumerate() {
            let p = format!("backbone.layers.{i}");
            let px = format!("{p}.mixer");
            let vec = |name: String, n: usize| -> Result<DevBuf<f32>, UploadError> {
                Ok(gpu.upload(&w.tensor(&name, &[n])?)?)
            };
            let opt_vec = |on: bool, name: String, n: usize| {
                if on { vec(name, n).map(Some) } else { Ok(None) }
            };
            let mixer = match kind {
                LayerKind::Mamba2 => {
                    let m = &mamba;
                    let (inner, conv_dim, nh, k) =
                        (m.intermediate(), m.conv_dim(), m.num_heads, m.conv_kernel);
                    let width = inner + conv_dim + nh;
                    let a_log = w.tensor(&format!("{px}.A_log"), &[nh])?;
                    let neg_a: Vec<f32> = a_log.iter().map(|&v| -v.exp()).collect();
                    Mixer::Mamba(MambaDev {
                        in_proj: matrix(gpu, w, &format!("{px}.in_proj.weight"), width, h, dt)?,
                        in_bias: opt_vec(m.proj_bias, format!("{px}.in_proj.bias"), width)?,
                        conv_w: gpu.upload(
                            &w.tensor(&format!("{px}.conv1d.weight"), &[conv_dim, 1, k])?,
                        )?,
                        conv_b: opt_vec(m.conv_bias, format!("{px}.conv1d.bias"), conv_dim)?,
                        neg_a: gpu.upload(&neg_a)?,
                        d: vec(format!("{px}.D"), nh)?,
                        dt_bias: vec(format!("{px}.dt_bias"), nh)?,
                        norm: vec(format!("{px}.norm.weight"), inner)?,
                        out_proj: matrix(gpu, w, &format!("{px}.out_proj.weight"), h, inner, dt)?,
                        out_bias: opt_vec(m.proj_bias, format!("{px}.out_proj.bias"), h)?,
                        state_index: idx[i],
                    })
                }
                LayerKind::Attention => {
                    Mixer::Attn(HybridAttnDev::load_plain(gpu, w, &px, &spec, idx[i])?)
                }
                LayerKind::Mlp => {
                    let (inter, b) = (spec.intermediate_size, spec.mlp_bias);
                    Mixer::Mlp(MlpDev {
                        up: matrix(gpu, w, &format!("{px}.up_proj.weight"), inter, h, dt)?,
                        up_bias: opt_vec(b, format!("{px}.up_proj.bias"), inter)?,
                        down: matrix(gpu, w, &format!("{px}.down_proj.weight"), h, inter, dt)?,
                        down_bias: opt_vec(b, format!("{px}.down_proj.bias"), h)?,
                    })
                }
                LayerKind::GatedDeltaNet => {
                    return Err(ModelError::Unsupported {
                        path: w.dir().join("config.json"),
                        what: format!("block {i}: Gated DeltaNet in a Nemotron-H model"),
                    }
                    .into());
                }
            };
            blocks.push(Block {
                norm: vec(format!("{p}.norm.weight"), h)?,
                mixer,
            });
        }
        let final_norm = gpu.upload(&w.tensor("backbone.norm_f.weight", &[h])?)?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(matrix(gpu, w, "lm_head.weight", v, h, dt)?)
        };
        Ok(Self {
            spec,
            mamba,
            embed,
            blocks,
            final_norm,
            lm_head,
            num_attn,
            num_rec,
        })
    }

    /// `(conv floats, SSM floats)` per slot of each Mamba-2 layer.
    pub fn state_shape(&self) -> (usize, usize) {
        let m = &self.mamba;
        (
            (m.conv_kernel - 1) * m.conv_dim(),
            m.num_heads * m.head_dim * m.state_size,
        )
    }

    pub fn widths(&self) -> Widths {
        let (s, m) = (&self.spec, &self.mamba);
        let (qd, kvd) = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
        let inner = m.intermediate();
        let inter = s.intermediate_size;
        Widths {
            wide: (inner + m.conv_dim() + m.num_heads)
                .max(qd + 2 * kvd)
                .max(inter),
            conv: m.conv_dim(),
            mid: inner.max(qd),
            act: inner.max(qd).max(inter),
        }
    }

    /// Runs every block; `cap(id)` captures `b.x` for ids 0..=L. Leaves the last block's
    /// (pre-norm) output in `b.x`. Fresh slots must already be zeroed.
    pub fn forward(&self, s: &Step<'_>, cap: &dyn Fn(usize) -> CudaResult<()>) -> CudaResult<()> {
        let (gpu, b, plan) = (s.gpu, s.b, s.plan);
        let (t, h, dt) = (plan.num_tokens, self.spec.hidden_size, self.spec.dtype);
        let (normed, proj) = (b.normed.ptr(), b.proj.ptr());
        let norm = |block: &Block| block.norm.ptr();
        let model = (&self.spec, &self.embed);
        s.run_blocks(model, &self.blocks, norm, cap, |_, block| {
            match &block.mixer {
                Mixer::Mamba(m) => self.mamba_forward(s, m),
                Mixer::Attn(a) => a.forward(gpu, b, dt, plan, s.cache),
                Mixer::Mlp(m) => {
                    let inter = self.spec.intermediate_size;
                    linear(gpu, normed, &m.up, b.wide.ptr(), t)?;
                    if let Some(bias) = &m.up_bias {
                        ops::bias_add(gpu, b.wide.ptr(), bias.ptr(), t, inter)?;
                    }
                    recurrent::relu2(gpu, b.wide.ptr(), b.act.ptr(), dt, t * inter)?;
                    linear(gpu, b.act.ptr(), &m.down, proj, t)?;
                    if let Some(bias) = &m.down_bias {
                        ops::bias_add(gpu, proj, bias.ptr(), t, h)?;
                    }
                    Ok(())
                }
            }
        })
    }

    /// Mamba-2 on `b.normed`, result in `b.proj`.
    fn mamba_forward(&self, s: &Step<'_>, m: &MambaDev) -> CudaResult<()> {
        let (gpu, b, seqs, states) = (s.gpu, s.b, s.seqs, s.states);
        let spec = &self.mamba;
        let t = seqs.num_tokens;
        let (inner, conv_dim, nh) = (spec.intermediate(), spec.conv_dim(), spec.num_heads);
        let width = inner + conv_dim + nh;
        let proj = b.wide.ptr();
        linear(gpu, b.normed.ptr(), &m.in_proj, proj, t)?;
        if let Some(bias) = &m.in_bias {
            ops::bias_add(gpu, proj, bias.ptr(), t, width)?;
        }
        let col = |c: usize| proj + (c * 4) as u64;
        recurrent::conv_silu(
            gpu,
            ConvIo {
                x: col(inner),
                stride: width,
                ch: conv_dim,
                k: spec.conv_kernel,
                w: m.conv_w.ptr(),
                bias: m.conv_b.as_ref().map_or(0, |b| b.ptr()),
                state: states.conv(m.state_index)?,
                out: b.conv.ptr(),
            },
            seqs,
        )?;
        recurrent::mamba2_scan(
            gpu,
            MambaIo {
                heads: nh,
                head_dim: spec.head_dim,
                d_state: spec.state_size,
                groups: spec.n_groups,
                xbc: b.conv.ptr(),
                dt: col(inner + conv_dim),
                dt_stride: width,
                neg_a: m.neg_a.ptr(),
                d: m.d.ptr(),
                dt_bias: m.dt_bias.ptr(),
                dt_min: spec.time_step_min as f32,
                state: states.ssm(m.state_index)?,
                y: b.mid.ptr(),
            },
            seqs,
        )?;
        let norm = GatedNormIo {
            x: b.mid.ptr(),
            z: proj,
            z_stride: width,
            w: m.norm.ptr(),
            out: b.act.ptr(),
            dtype: self.spec.dtype,
            t,
            eps: self.spec.rms_norm_eps,
        };
        recurrent::mamba2_gated_norm(gpu, norm, inner, inner / spec.n_groups)?;
        linear(gpu, b.act.ptr(), &m.out_proj, b.proj.ptr(), t)?;
        if let Some(bias) = &m.out_bias {
            ops::bias_add(gpu, b.proj.ptr(), bias.ptr(), t, self.spec.hidden_size)?;
        }
        Ok(())
    }
}

fn missing(spec: &ModelSpec) -> UploadError {
    UploadError::Model(ModelError::InvalidOptions(format!(
        "{} spec without Mamba-2 geometry",
        spec.architecture.hf_name()
    )))
}

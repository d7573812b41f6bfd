//! Full attention of the hybrid models on the device (models::hybrid_attn): Qwen3.5 /
//! Qwen3-Next gated attention (zero-centred per-head q/k norms, partial rotary, output gate)
//! and Nemotron-H plain attention (no RoPE, no norms, no bias).
//!
//! The gated q_proj rows are per head `[q(hd) | gate(hd)]` on disk; they are re-ordered at load
//! into `[q (all heads) | gate (all heads)]`, so the fused projection's rows are
//! `[q | gate | k | v]` and q / k are plain head ranges for the shared norm, RoPE, KV-write and
//! attention kernels.

use super::super::context::{CudaResult, DevBuf, Gpu, elems_cfg, launch};
use super::super::gemm::linear;
use super::super::kv_cache::{DevKvCache, DevPlan, QkvRows};
use super::super::ops::{self, suffix};
pub(super) use super::super::weights::upload_matrix as matrix;
use super::super::weights::{DevWeight, UploadError, upload_as};
use super::Buffers;
use super::recurrent::i32_of;
use crate::kernels::cpu::ops::Rope;
pub(super) use crate::models::hybrid_attn::one_plus;
use crate::models::{ModelSpec, WeightDtype, Weights};

/// One attention layer's weights on the device.
pub struct HybridAttnDev {
    /// `[q | gate | k | v]` (gated) or `[q | k | v]` rows.
    qkv: DevWeight,
    qkv_bias: Option<DevBuf<f32>>,
    /// `1 + w` (zero-centred), gated form only.
    q_norm: Option<DevBuf<f32>>,
    k_norm: Option<DevBuf<f32>>,
    o: DevWeight,
    o_bias: Option<DevBuf<f32>>,
    gated: bool,
    /// `rotary_dim / 2` inverse frequencies; None = no RoPE.
    inv_freq: Option<DevBuf<f32>>,
    rotary_dim: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
    kv_index: usize,
}

/// Per-head `[q(hd) | gate(hd)]` rows (each `inp` wide) -> `[q (all heads) | gate (all)]`.
fn split_q_gate(rows: &[f32], heads: usize, hd: usize, inp: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len());
    for part in 0..2 {
        for h in 0..heads {
            let from = (h * 2 * hd + part * hd) * inp;
            out.extend_from_slice(&rows[from..from + hd * inp]);
        }
    }
    out
}

impl HybridAttnDev {
    /// Qwen3.5 / Qwen3-Next gated attention (`prefix` = `...layers.{i}.self_attn`).
    pub fn load_gated(
        gpu: &Gpu,
        w: &Weights,
        prefix: &str,
        spec: &ModelSpec,
        rotary_dim: usize,
        kv_index: usize,
    ) -> Result<Self, UploadError> {
        let (h, hd, dt) = (spec.hidden_size, spec.head_dim, spec.dtype);
        let (nh, qd, kvd) = (spec.num_heads, spec.num_heads * hd, spec.num_kv_heads * hd);
        let n = |s: &str| format!("{prefix}.{s}");
        let mut rows = split_q_gate(&w.tensor(&n("q_proj.weight"), &[2 * qd, h])?, nh, hd, h);
        rows.extend(w.tensor(&n("k_proj.weight"), &[kvd, h])?);
        rows.extend(w.tensor(&n("v_proj.weight"), &[kvd, h])?);
        let qkv_bias = if spec.qkv_bias {
            let mut b = split_q_gate(&w.tensor(&n("q_proj.bias"), &[2 * qd])?, nh, hd, 1);
            b.extend(w.tensor(&n("k_proj.bias"), &[kvd])?);
            b.extend(w.tensor(&n("v_proj.bias"), &[kvd])?);
            Some(gpu.upload(&b)?)
        } else {
            None
        };
        let rope = Rope::new(rotary_dim, spec.rope_theta, spec.rope_scaling);
        Ok(Self {
            qkv: DevWeight {
                data: upload_as(gpu, &rows, dt)?,
                rows: 2 * qd + 2 * kvd,
                cols: h,
            },
            qkv_bias,
            q_norm: Some(gpu.upload(&one_plus(w.tensor(&n("q_norm.weight"), &[hd])?))?),
            k_norm: Some(gpu.upload(&one_plus(w.tensor(&n("k_norm.weight"), &[hd])?))?),
            o: matrix(gpu, w, &n("o_proj.weight"), h, qd, dt)?,
            o_bias: if spec.o_bias {
                Some(gpu.upload(&w.tensor(&n("o_proj.bias"), &[h])?)?)
            } else {
                None
            },
            gated: true,
            inv_freq: Some(gpu.upload(rope.inv_freq())?),
            rotary_dim,
            heads: nh,
            kv_heads: spec.num_kv_heads,
            head_dim: hd,
            eps: spec.rms_norm_eps,
            kv_index,
        })
    }

    /// Nemotron-H attention (`prefix` = `...layers.{i}.mixer`).
    pub fn load_plain(
        gpu: &Gpu,
        w: &Weights,
        prefix: &str,
        spec: &ModelSpec,
        kv_index: usize,
    ) -> Result<Self, UploadError> {
        let (h, hd, dt) = (spec.hidden_size, spec.head_dim, spec.dtype);
        let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
        let n = |s: &str| format!("{prefix}.{s}");
        let mut rows = w.tensor(&n("q_proj.weight"), &[qd, h])?;
        rows.extend(w.tensor(&n("k_proj.weight"), &[kvd, h])?);
        rows.extend(w.tensor(&n("v_proj.weight"), &[kvd, h])?);
        Ok(Self {
            qkv: DevWeight {
                data: upload_as(gpu, &rows, dt)?,
                rows: qd + 2 * kvd,
                cols: h,
            },
            qkv_bias: None,
            q_norm: None,
            k_norm: None,
            o: matrix(gpu, w, &n("o_proj.weight"), h, qd, dt)?,
            o_bias: None,
            gated: false,
            inv_freq: None,
            rotary_dim: 0,
            heads: spec.num_heads,
            kv_heads: spec.num_kv_heads,
            head_dim: hd,
            eps: spec.rms_norm_eps,
            kv_index,
        })
    }

    /// Width of the fused projection's rows.
    pub fn qkv_width(&self) -> usize {
        self.qkv.rows
    }

    /// Query width (heads × head_dim).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// `b.proj[T, hidden]` = attention block output for the normed rows `b.normed`.
    pub fn forward(
        &self,
        gpu: &Gpu,
        b: &Buffers,
        dtype: WeightDtype,
        plan: &DevPlan,
        cache: &DevKvCache,
    ) -> CudaResult<()> {
        let t = plan.num_tokens;
        let (hd, qd) = (self.head_dim, self.q_dim());
        let width = self.qkv_width();
        let qkv = b.wide.ptr();
        linear(gpu, b.normed.ptr(), &self.qkv, qkv, t)?;
        if let Some(bias) = &self.qkv_bias {
            ops::bias_add(gpu, qkv, bias.ptr(), t, width)?;
        }
        let rows = QkvRows {
            base: qkv,
            width,
            k_col: if self.gated { 2 * qd } else { qd },
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: hd,
        };
        let norms = (self.q_norm.as_ref())
            .zip(self.k_norm.as_ref())
            .map(|(q, k)| (q.ptr(), k.ptr(), self.eps));
        let rope = (self.inv_freq.as_ref()).map(|inv| (self.rotary_dim, inv.ptr()));
        if self.gated {
            // f32 attention output, then `* sigmoid(gate)` into the o_proj input dtype.
            let attn = b.mid.ptr();
            let out = (attn, WeightDtype::F32);
            cache.attend(gpu, self.kv_index, rows, norms, rope, out, plan)?;
            let total = t * qd;
            if total > 0 {
                let name = format!("attn_gate_{}", suffix(dtype));
                launch!(
                    gpu,
                    &name,
                    elems_cfg(total)?,
                    attn,
                    qkv,
                    width as i64,
                    i32_of(qd, "gate column")?,
                    b.act.ptr(),
                    i32_of(qd, "q dim")?,
                    total as i64
                )?;
            }
        } else {
            let out = (b.act.ptr(), dtype);
            cache.attend(gpu, self.kv_index, rows, norms, rope, out, plan)?;
        }
        linear(gpu, b.act.ptr(), &self.o, b.proj.ptr(), t)?;
        if let Some(bias) = &self.o_bias {
            ops::bias_add(gpu, b.proj.ptr(), bias.ptr(), t, self.o.rows)?;
        }
        Ok(())
    }
}

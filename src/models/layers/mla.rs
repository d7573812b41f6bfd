//! Multi-head latent attention (DeepSeek-V2 / V3, transformers' `DeepseekV3Attention`), run
//! as plain attention over the paged KV cache: q from `q_proj` (or `q_a_proj` ->
//! `q_a_layernorm` -> `q_b_proj`); the latent `kv_a_proj_with_mqa` -> `kv_a_layernorm` ->
//! `kv_b_proj` gives each head's k (no position) and v; the rest of `kv_a_proj_with_mqa` is
//! the one rotated key every head shares. [`Device::mla_heads`] lays q, k and v out as a fused
//! projection of `D = nope + rope` dims per head (rotated dims first, v zero-padded), so the
//! attention kernels rotate each head's first `rope` dims and cache expanded keys and values;
//! `o_proj` is stored with zero columns for v's padding.

use super::{Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{
    AttnCall, AttnSoftmax, DevResult, MlaDims, QkvLayout, QueryTemperature,
};

/// How q is made from the normed rows.
pub enum MlaQuery<D: Device> {
    /// `q_proj` `[heads · D, hidden]`.
    Direct(D::Linear),
    /// `q_a_proj` `[q_lora, hidden]`, `q_a_layernorm` `[q_lora]`, `q_b_proj` `[heads · D,
    /// q_lora]`.
    Lora {
        a: D::Linear,
        norm: D::Vector,
        b: D::Linear,
        rank: usize,
    },
}

pub struct MlaAttention<D: Device> {
    pub q: MlaQuery<D>,
    /// `kv_a_proj_with_mqa`'s first `kv_lora` rows (the latent).
    pub kv_latent: D::Linear,
    /// `kv_a_layernorm` `[kv_lora]`.
    pub kv_norm: D::Vector,
    /// `kv_b_proj` `[heads · (nope + v), kv_lora]`.
    pub kv_b: D::Linear,
    /// `kv_a_proj_with_mqa`'s last `rope` rows (the shared rotated key).
    pub k_rope: D::Linear,
    /// `o_proj` `[hidden, heads · D]`: `[hidden, heads · v]` with zero columns for v's padding.
    pub o: D::Linear,
    pub rope: D::Rope,
    pub dims: MlaDims,
    pub kv_lora: usize,
    /// The q / kv latent norms' eps (`DeepseekV3RMSNorm`'s default: the config's is not
    /// passed to them).
    pub latent_eps: f64,
    /// The softmax scale over `D^-0.5` (YaRN's mscale²).
    pub score_factor: f64,
    /// Mistral 4's query scale by position.
    pub temperature: Option<QueryTemperature>,
    /// This layer's index among the attention layers (its KV cache layer).
    pub kv_layer: usize,
}

impl<D: Device> MlaAttention<D> {
    pub(super) fn widths(&self) -> Widths {
        let d = self.dims;
        let hd = d.heads * d.head_dim();
        let q_rank = match &self.q {
            MlaQuery::Lora { rank, .. } => *rank,
            MlaQuery::Direct(_) => 0,
        };
        Widths {
            wide: d.out_width(),
            conv: q_rank.max(self.kv_lora).max(d.rope),
            mid: hd,
            act: q_rank.max(self.kv_lora).max(hd),
            aux: d.heads * (d.nope + d.v),
            ..Widths::default()
        }
    }

    /// q into `s.mid`, the expanded latent into `s.aux`, the shared rotated key into `s.conv`
    /// (the latents pass through `s.conv` and `s.act` first), the heads into `s.wide`, then
    /// attention into `s.act` and `o_proj` into `s.proj`.
    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        match &self.q {
            MlaQuery::Direct(w) => dev.matmul(&s.normed, w, &mut s.mid)?,
            MlaQuery::Lora { a, norm, b, .. } => {
                dev.matmul(&s.normed, a, &mut s.conv)?;
                dev.rms_norm(&s.conv, norm, self.latent_eps, &mut s.act)?;
                dev.matmul(&s.act, b, &mut s.mid)?;
            }
        }
        dev.matmul(&s.normed, &self.kv_latent, &mut s.conv)?;
        dev.rms_norm(&s.conv, &self.kv_norm, self.latent_eps, &mut s.act)?;
        dev.matmul(&s.act, &self.kv_b, &mut s.aux)?;
        dev.matmul(&s.normed, &self.k_rope, &mut s.conv)?;
        dev.mla_heads(&s.mid, &s.aux, &s.conv, &self.dims, &mut s.wide)?;
        let d = self.dims;
        let call = AttnCall {
            kv_layer: self.kv_layer,
            layout: QkvLayout {
                k_col: d.heads * d.head_dim(),
                heads: d.heads,
                kv_heads: d.heads,
                head_dim: d.head_dim(),
            },
            qk_norm: None,
            v_norm: None,
            rope: Some((&self.rope, d.rope)),
            softmax: AttnSoftmax {
                score_factor: self.score_factor,
                temperature: self.temperature,
                ..AttnSoftmax::causal()
            },
        };
        dev.attention(ctx.step, ctx.kv, &mut s.wide, &call, &mut s.act)?;
        dev.matmul(&s.act, &self.o, &mut s.proj)
    }
}

//! Multi-head latent attention (DeepSeek-V2 / V3, transformers' `DeepseekV3Attention`), run
//! as plain attention over the paged KV cache: q from `q_proj` (or `q_a_proj` ->
//! `q_a_layernorm` -> `q_b_proj`); the latent `kv_a_proj_with_mqa` -> `kv_a_layernorm` ->
//! `kv_b_proj` gives each head's k (no position) and v; the rest of `kv_a_proj_with_mqa` is
//! the one rotated key every head shares. [`Device::mla_heads`] lays q, k and v out as a fused
//! projection of `D = nope + rope` dims per head (rotated dims first, v zero-padded), so the
//! attention kernels rotate each head's first `rope` dims and cache expanded keys and values;
//! `o_proj` is stored with zero columns for v's padding. With DeepSeek Sparse Attention
//! (DeepSeek-V3.2, GLM-5) the layer's indexer first picks each query's keys
//! ([`Device::dsa_select`]) and the attention runs over those only.

use super::{Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{
    AttnCall, DevResult, DeviceError, DsaCall, MlaDims, QkNormForm, QkvLayout, QueryTemperature,
    RowNorm, SoftmaxVariant,
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

/// DeepSeek Sparse Attention on an MLA layer ([`crate::kernels::dsa`]): its own indexer, or
/// none on GLM-5's shared layers (they attend over the last indexer's selection).
pub struct SparseAttention<D: Device> {
    pub indexer: Option<Indexer<D>>,
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    pub interleave: bool,
}

/// One layer's indexer (`self_attn.indexer.*`).
pub struct Indexer<D: Device> {
    /// `wq_b` `[heads · head_dim, q_lora]`: over q's normed latent.
    pub wq_b: D::Linear,
    /// `wk` `[head_dim, hidden]`.
    pub wk: D::Linear,
    /// `k_norm` (LayerNorm) weight and bias `[head_dim]`.
    pub k_norm: (D::Vector, D::Vector),
    /// `weights_proj` `[heads, hidden]`, f32 (transformers keeps it in f32).
    pub weights_proj: D::Linear,
    /// Its index-key cache layer.
    pub index_layer: usize,
}

/// `k_norm`'s eps (`nn.LayerNorm(head_dim, eps=1e-6)`).
const INDEX_NORM_EPS: f64 = 1e-6;

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
    pub sparse: Option<SparseAttention<D>>,
}

impl<D: Device> MlaAttention<D> {
    pub(super) fn widths(&self) -> Widths {
        let d = self.dims;
        let hd = d.heads * d.head_dim();
        let q_rank = match &self.q {
            MlaQuery::Lora { rank, .. } => *rank,
            MlaQuery::Direct(_) => 0,
        };
        let (ih, id) = (self.sparse.as_ref()).map_or((0, 0), |x| (x.heads, x.head_dim));
        Widths {
            wide: d.out_width().max(ih * id),
            conv: q_rank.max(self.kv_lora).max(d.rope).max(id),
            mid: hd,
            act: q_rank.max(self.kv_lora).max(hd),
            aux: (d.heads * (d.nope + d.v)).max(ih),
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
                dev.norm(&s.conv, norm, RowNorm::rms(self.latent_eps), &mut s.act)?;
                dev.matmul(&s.act, b, &mut s.mid)?;
            }
        }
        if let Some(sparse) = &self.sparse {
            self.select(dev, ctx, s, sparse)?;
        }
        dev.matmul(&s.normed, &self.kv_latent, &mut s.conv)?;
        dev.norm(
            &s.conv,
            &self.kv_norm,
            RowNorm::rms(self.latent_eps),
            &mut s.act,
        )?;
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
            norm_form: QkNormForm::Rms,
            v_norm: None,
            rope: Some((&self.rope, d.rope)),
            softmax: SoftmaxVariant {
                score_factor: self.score_factor,
                temperature: self.temperature,
                sparse: self.sparse.as_ref().map(|x| x.topk),
                ..SoftmaxVariant::causal()
            },
            shared_kv: false,
        };
        dev.attention(ctx.step, ctx.kv, &mut s.wide, &call, &mut s.act)?;
        dev.matmul(&s.act, &self.o, &mut s.proj)
    }

    /// The indexer's selection (q from q's normed latent in `s.act`) into the KV cache's
    /// state; a shared layer keeps the last one. Its q, k and head weights pass through
    /// `s.wide`, `s.conv` and `s.aux`, free until the latents fill them.
    fn select(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
        sparse: &SparseAttention<D>,
    ) -> DevResult<()> {
        let Some(ix) = &sparse.indexer else {
            return Ok(());
        };
        let MlaQuery::Lora { .. } = &self.q else {
            let msg = "a sparse-attention indexer without q's latent";
            return Err(DeviceError::Invalid(msg.into()));
        };
        dev.matmul(&s.act, &ix.wq_b, &mut s.wide)?;
        dev.matmul(&s.normed, &ix.wk, &mut s.conv)?;
        dev.matmul(&s.normed, &ix.weights_proj, &mut s.aux)?;
        let call = DsaCall {
            index_layer: ix.index_layer,
            heads: sparse.heads,
            head_dim: sparse.head_dim,
            topk: sparse.topk,
            rope: (&self.rope, self.dims.rope),
            interleave: sparse.interleave,
            k_norm: (&ix.k_norm.0, &ix.k_norm.1, INDEX_NORM_EPS),
        };
        dev.dsa_select(ctx.step, ctx.kv, &call, &mut s.wide, &mut s.conv, &s.aux)
    }
}

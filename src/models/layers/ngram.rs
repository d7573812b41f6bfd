//! Qwen4-Exp's hashed n-gram embeddings (transformers' `Qwen4ExpTextPLELayer`), added to the
//! residual streams at the start of their layers, before the first hyper-connection: with
//! `e` the token's n-gram rows side by side ([`NgramHash`], a gather-only table),
//! `key = norm_key(key_proj(e))` and `query = norm_query(x)` (each stream's `H` values normed
//! alone), per stream `gated_k = sigmoid(signed_sqrt(key_k · query_k / √H)) · value_proj(e)`,
//! then `x += gated + silu(conv(norm_conv(gated)))`, the conv causal and depthwise with
//! dilation `ngram_size`, its window carried per request like the recurrent layers' convs.
//!
//! The dilated conv runs as an undilated one whose taps between the real ones are zero (its
//! weights spread at load): the same products in the same order, zeros added.

use super::{CausalConv, Ctx, Scratch, Widths};
use crate::kernels::device::{BufKind, Cols, DevResult, DeviceError, HyperOp};
use crate::kernels::{CHUNK_CONTEXT, Device};
use crate::models::ngram_hash::NgramHash;

pub struct NgramEmbedding<D: Device> {
    pub hash: NgramHash,
    /// `ngram_embedding` `[rows, embed_dim / heads]`.
    pub table: D::Table,
    /// `key_proj` `[S·H, embed_dim]`, `value_proj` `[H, embed_dim]`.
    pub key_proj: D::Linear,
    pub value_proj: D::Linear,
    /// `1 + w` of `norm_key`, `norm_query`, `norm_conv` (`S·H` each).
    pub norm_key: D::Vector,
    pub norm_query: D::Vector,
    pub norm_conv: D::Vector,
    /// Over the `S·H` channels, its taps spread by the dilation.
    pub conv: CausalConv<D>,
    pub embed_dim: usize,
    pub streams: usize,
    pub hidden: usize,
    pub eps: f64,
}

/// The n-gram layer's buffers: the gathered rows (f32, then as the GEMMs' input), three
/// `[T, S·H]` f32 buffers and the value `[T, H]`.
pub struct NgramScratch<D: Device> {
    pub rows: D::Buf,
    pub rows_in: D::Buf,
    pub a: D::Buf,
    pub b: D::Buf,
    pub c: D::Buf,
    pub value: D::Buf,
}

impl<D: Device> NgramScratch<D> {
    /// Buffers for `t` tokens: (embed_dim, streams · hidden, hidden).
    pub fn new(dev: &D, (embed, wide, hidden): (usize, usize, usize), t: usize) -> DevResult<Self> {
        use BufKind::{F32, GemmIn};
        Ok(Self {
            rows: dev.buffer(t, embed, F32)?,
            rows_in: dev.buffer(t, embed, GemmIn)?,
            a: dev.buffer(t, wide, F32)?,
            b: dev.buffer(t, wide, F32)?,
            c: dev.buffer(t, wide, F32)?,
            value: dev.buffer(t, hidden, F32)?,
        })
    }
}

impl<D: Device> NgramEmbedding<D> {
    /// Conv-window floats per request slot (no recurrent state).
    pub fn state_shape(&self) -> (usize, usize) {
        (self.conv.state_floats(self.streams * self.hidden), 0)
    }

    pub(super) fn widths(&self) -> Widths {
        let wide = self.streams * self.hidden;
        Widths {
            ngram: Some((self.embed_dim, wide, self.hidden)),
            ..Widths::default()
        }
    }

    /// `s.x += gated + silu(conv(norm_conv(gated)))` for the step's tokens.
    pub fn forward(&self, dev: &D, ctx: &mut Ctx<'_, '_, D>, s: &mut Scratch<D>) -> DevResult<()> {
        let ids = self.ids(ctx)?;
        let n = s.ngram.as_mut().ok_or_else(|| {
            DeviceError::Invalid("n-gram embeddings without their buffers".into())
        })?;
        let (eps, group) = (self.eps, self.hidden);
        dev.table_rows(&self.table, &ids, self.hash.heads(), &mut n.rows)?;
        dev.cast(&n.rows, &mut n.rows_in)?;
        dev.matmul(&n.rows_in, &self.key_proj, &mut n.a)?;
        dev.matmul(&n.rows_in, &self.value_proj, &mut n.value)?;
        let (w, x) = (&self.norm_key, &n.a);
        dev.hyper(HyperOp::GroupNorm {
            x,
            w,
            group,
            eps,
            out: &mut n.b,
        })?;
        let (w, x) = (&self.norm_query, &s.x);
        dev.hyper(HyperOp::GroupNorm {
            x,
            w,
            group,
            eps,
            out: &mut n.c,
        })?;
        let (key, query, value) = (&n.b, &n.c, &n.value);
        dev.hyper(HyperOp::NgramGate {
            key,
            query,
            value,
            out: &mut n.a,
        })?;
        let (w, x) = (&self.norm_conv, &n.a);
        dev.hyper(HyperOp::GroupNorm {
            x,
            w,
            group,
            eps,
            out: &mut n.b,
        })?;
        let input = Cols::new(&n.b, 0, self.streams * self.hidden);
        self.conv.run(dev, ctx, input, &mut n.c)?;
        // transformers: `gated + conv`, then the stream plus that.
        dev.add(&mut n.c, &n.a)?;
        dev.add(&mut s.x, &n.c)
    }

    /// The step's n-gram ids, chunk by chunk from each chunk's tokens and its context.
    fn ids(&self, ctx: &Ctx<'_, '_, D>) -> DevResult<Vec<u32>> {
        let batch = ctx.batch;
        let mut ids = Vec::with_capacity(batch.token_ids.len() * self.hash.heads());
        let mut at = 0;
        for (i, c) in batch.seqs.iter().enumerate() {
            if c.context.len() != c.start.min(CHUNK_CONTEXT) {
                return Err(DeviceError::Invalid(format!(
                    "chunk {i} at {} carries {} tokens of context, not {}",
                    c.start,
                    c.context.len(),
                    c.start.min(CHUNK_CONTEXT)
                )));
            }
            let tokens = batch.token_ids.get(at..at + c.len).ok_or_else(|| {
                DeviceError::Invalid(format!("chunk {i} past the batch's tokens"))
            })?;
            self.hash.ids(&c.context, tokens, &mut ids);
            at += c.len;
        }
        Ok(ids)
    }
}

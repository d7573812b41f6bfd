//! Full attention over the paged KV cache: fused q/k/v projection (+ bias), optional per-head
//! q/k RMSNorm (and v RMSNorm: Gemma 4), RoPE (full or partial rotary, or none), K/V into the
//! cache, causal GQA attention (optionally gpt-oss's sliding window and sinks, a score factor,
//! Llama-4's chunks, Llama-4's and Mistral's query temperature), optional output gate
//! `· sigmoid(gate)` (Qwen3.5 / Qwen3-Next), `o_proj`; with Qwen4-Exp's QSA indexer, each
//! token past its dense length attends to the keys the indexer picks.

use super::{Ctx, Scratch, Widths};
use crate::kernels::Device;
use crate::kernels::device::{
    AttnCall, Cols, DevResult, DeviceError, GateFn, QkNormForm, QkvLayout, QsaCall, SoftmaxVariant,
};

/// One attention sublayer's weights on the device.
pub struct Attention<D: Device> {
    /// `[q | k | v]` rows, or `[q | gate | k | v]` for the gated form.
    pub qkv: D::Linear,
    pub o: D::Linear,
    /// q and k RMSNorm weights (per head or whole); no k weights on a layer that shares an
    /// earlier layer's keys (`shared_kv`).
    pub qk_norm: Option<(D::Vector, Option<D::Vector>)>,
    /// How the q / k norm weights apply (RMSNorm before or after RoPE, Cohere's LayerNorm of
    /// each head).
    pub qk_norm_form: QkNormForm,
    /// Per-head v RMSNorm weights (Gemma 4's unweighted norm: ones).
    pub v_norm: Option<D::Vector>,
    /// RoPE table and rotary dims of each head.
    pub rope: Option<(D::Rope, usize)>,
    pub gated: bool,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f64,
    /// This layer's index among the attention layers (its KV cache layer), or with
    /// `shared_kv` the cache layer of the earlier layer whose keys and values it reads.
    pub kv_layer: usize,
    /// Gemma 4's KV sharing: `qkv` projects q only, `qk_norm` has no k weights; the layer
    /// writes no cache.
    pub shared_kv: bool,
    /// The softmax's variant, its sinks on the device (borrowed into each call); `sparse:
    /// Some(dense length)` with `qsa`.
    pub variant: SoftmaxVariant<D::Vector>,
    /// Qwen4-Exp's QSA indexer (its keys in index-cache layer `kv_layer`).
    pub qsa: Option<QsaIndexer<D>>,
    /// MiMo-V2-Flash's `attention_value_scale`: a factor on every value, applied to the
    /// attention's output (the same product: each output is a weighted sum of values).
    pub value_scale: Option<f32>,
    /// OLMo's `clip_qkv`: the projection's q, k and v clamped to `±limit` before norms and
    /// RoPE.
    pub clip_qkv: Option<f32>,
}

/// Qwen4-Exp's QSA indexer of one attention layer (`self_attn.indexer`,
/// [`crate::kernels::qsa`]): `index_qk_proj`'s q rows and k rows, `q_layernorm` and
/// `k_layernorm` (`1 + weight`).
pub struct QsaIndexer<D: Device> {
    pub q: D::Linear,
    pub k: D::Linear,
    pub q_norm: D::Vector,
    pub k_norm: D::Vector,
    pub heads: usize,
    pub head_dim: usize,
    pub budget: usize,
    pub ratio: usize,
}

impl<D: Device> Attention<D> {
    /// The plain layer of `spec`'s heads and eps: causal softmax, no norms, no RoPE, no gate,
    /// keys of its own in cache layer `kv_layer`. Loaders set what differs by struct update.
    pub fn plain(
        (qkv, o): (D::Linear, D::Linear),
        spec: &crate::models::ModelSpec,
        kv_layer: usize,
    ) -> Self {
        Self {
            qkv,
            o,
            qk_norm: None,
            qk_norm_form: QkNormForm::Rms,
            v_norm: None,
            rope: None,
            gated: false,
            heads: spec.num_heads,
            kv_heads: spec.num_kv_heads,
            head_dim: spec.head_dim,
            eps: spec.rms_norm_eps,
            kv_layer,
            shared_kv: false,
            variant: SoftmaxVariant::causal(),
            qsa: None,
            value_scale: None,
            clip_qkv: spec.clip_qkv,
        }
    }

    fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    fn layout(&self) -> QkvLayout {
        let qd = self.q_dim();
        QkvLayout {
            k_col: if self.gated { 2 * qd } else { qd },
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }

    pub(super) fn widths(&self) -> Widths {
        let l = self.layout();
        let qd = self.q_dim();
        let (iq, ik) = (self.qsa.as_ref()).map_or((0, 0), |x| (x.heads * x.head_dim, x.head_dim));
        Widths {
            wide: l.width(self.shared_kv).max(iq),
            mid: qd,
            act: qd,
            aux: ik,
            ..Widths::default()
        }
    }

    pub(super) fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
    ) -> DevResult<()> {
        if let Some(ix) = &self.qsa {
            self.select(dev, ctx, s, ix)?;
        }
        dev.matmul(&s.normed, &self.qkv, &mut s.wide)?;
        if let Some(limit) = self.clip_qkv {
            dev.clamp(&mut s.wide, limit)?;
        }
        let call = AttnCall {
            kv_layer: self.kv_layer,
            layout: self.layout(),
            qk_norm: (self.qk_norm.as_ref()).map(|(q, k)| (q, k.as_ref(), self.eps)),
            norm_form: self.qk_norm_form,
            v_norm: (self.v_norm.as_ref()).map(|v| (v, self.eps)),
            rope: (self.rope.as_ref()).map(|(r, rot)| (r, *rot)),
            softmax: self.variant.as_ref(),
            shared_kv: self.shared_kv,
        };
        if self.gated {
            dev.attention(ctx.step, ctx.kv, &mut s.wide, &call, &mut s.mid)?;
            self.scale_values(dev, &mut s.mid)?;
            let qd = self.q_dim();
            let gate = Cols {
                buf: &s.wide,
                col: qd,
                width: qd,
            };
            let x = Cols::new(&s.mid, 0, qd);
            dev.gate(x, gate, GateFn::Sigmoid, &mut s.act)?;
        } else {
            dev.attention(ctx.step, ctx.kv, &mut s.wide, &call, &mut s.act)?;
            self.scale_values(dev, &mut s.act)?;
        }
        dev.matmul(&s.act, &self.o, &mut s.proj)
    }

    fn scale_values(&self, dev: &D, out: &mut D::Buf) -> DevResult<()> {
        match self.value_scale {
            Some(f) => dev.scale(out, f),
            None => Ok(()),
        }
    }

    /// The QSA indexer's selection into the KV cache's state; its q and raw keys pass through
    /// `s.wide` and `s.aux`, free until the projection fills them.
    fn select(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
        ix: &QsaIndexer<D>,
    ) -> DevResult<()> {
        let Some((rope, rot)) = &self.rope else {
            return Err(DeviceError::Invalid("a QSA indexer without RoPE".into()));
        };
        dev.matmul(&s.normed, &ix.q, &mut s.wide)?;
        dev.matmul(&s.normed, &ix.k, &mut s.aux)?;
        let call = QsaCall {
            index_layer: self.kv_layer,
            heads: ix.heads,
            head_dim: ix.head_dim,
            budget: ix.budget,
            ratio: ix.ratio,
            rope: (rope, *rot),
            norms: (&ix.q_norm, &ix.k_norm, self.eps),
        };
        dev.qsa_select(ctx.step, ctx.kv, &call, &mut s.wide, &s.aux)
    }
}

//! [`Decoder`]: what every architecture loads into — the embedding, the decoder layers, the
//! final norm and the LM head — and the residual stream every architecture runs:
//! `x = embed(tokens) · scale` (layer id 0; the scale is Gemma's or Granite's; Gemma 4 E2B /
//! E4B make their per-layer inputs from these rows before the first layer); per part
//! `x += sublayer(norm(x))` — Gemma's sandwich norms the sublayer's output first,
//! `x += post_norm(sublayer(norm(x)))`, OLMo 2 / 3 and EXAONE 4 only its output,
//! `x += post_norm(sublayer(x))`; Granite scales it, `x += r · sublayer(norm(x))` — the
//! add fused into the next part's norm (exact in f32); Gemma 4 multiplies the stream by a
//! per-layer scalar after its layer's last add. The row captured as id `i` is the
//! residual stream after `i` layers; id L is the last layer's output before the final norm
//! (DESIGN.md §1.1). With hyper-connections (Qwen4-Exp) the stream is `S` copies of the
//! embedded rows, each sublayer between them through its connection, and the rows captured are
//! all `S · hidden` values (transformers' `hidden_states[i]` for `i < L`); the final mixer
//! takes the final norm's place.

use super::ModelSpec;
use super::layers::{
    Ctx, HyperConnection, HyperScratch, Layer, PerLayerEmbedding, Sublayer, Widths,
};
use crate::kernels::Device;
use crate::kernels::device::{BufKind, DevResult, DeviceError, HyperOp, IndexShape};

pub use super::layers::Scratch;

/// A loaded model on device `D`.
pub struct Decoder<D: Device> {
    pub spec: ModelSpec,
    pub vocab: Vocab<D>,
    /// Multiplies the embedded rows (Gemma's `√hidden` in the weights' dtype; 1 elsewhere).
    pub embed_scale: f32,
    pub layers: Vec<Layer<D>>,
    /// Gemma 4 E2B / E4B's per-layer embeddings, made from the embedded rows.
    pub ple: Option<PerLayerEmbedding<D>>,
    pub final_norm: FinalNorm<D>,
}

/// What turns the last layer's output into the LM head's input.
pub enum FinalNorm<D: Device> {
    /// The weight of the spec's norm ([`ModelSpec::row_norm`]).
    Norm(D::Vector),
    /// Qwen4-Exp's `hyper_connection_mixer`: the streams mixed into hidden-wide rows.
    Mixer(HyperConnection<D>),
}

/// The token embedding and the LM head.
pub enum Vocab<D: Device> {
    /// One matrix, gathered from and multiplied by.
    Tied(D::Linear),
    /// The embedding only ever gathered from ([`Device::table`]), and the head.
    Untied { table: D::Table, head: D::Linear },
}

/// How much cache a model needs: KV cache layers and their width, per-slot state shapes of
/// each recurrent layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheShape {
    pub kv_layers: usize,
    pub kv_dim: usize,
    pub state_shapes: Vec<(usize, usize)>,
    /// DeepSeek Sparse Attention's index keys.
    pub index: Option<IndexShape>,
}

impl<D: Device> Decoder<D> {
    fn sublayers(&self) -> impl Iterator<Item = &Sublayer<D>> {
        self.layers
            .iter()
            .flat_map(|l| &l.parts)
            .flat_map(|p| p.sublayer.leaves())
    }

    pub fn cache_shape(&self) -> CacheShape {
        let s = &self.spec;
        let kv_layers = self
            .sublayers()
            .filter(|l| match l {
                // A layer sharing an earlier layer's keys and values has no cache of its own.
                Sublayer::Attention(a) => !a.shared_kv,
                Sublayer::Mla(_) => true,
                _ => false,
            })
            .count();
        let state_shapes = self
            .sublayers()
            .filter_map(|l| match l {
                Sublayer::GatedDeltaNet(g) => Some(g.state_shape()),
                Sublayer::Kda(k) => Some(k.state_shape()),
                Sublayer::Mamba1(m) => Some(m.state_shape()),
                Sublayer::Mamba2(m) => Some(m.state_shape()),
                Sublayer::ShortConv(c) => Some(c.state_shape()),
                Sublayer::Ngram(n) => Some(n.state_shape()),
                _ => None,
            })
            .collect();
        let dsa = (s.hybrid.as_ref()).and_then(|h| h.mla.as_ref()?.dsa.as_ref());
        CacheShape {
            kv_layers,
            kv_dim: s.num_kv_heads * s.head_dim,
            state_shapes,
            // DSA's indexer layers, or QSA's raw keys on every attention layer.
            index: (dsa.map(|d| (d.indexer_layers(), d.head_dim)))
                .or(s.qsa.map(|q| (kv_layers, q.head_dim)))
                .map(|(layers, dim)| IndexShape { layers, dim }),
        }
    }

    /// Activation buffers for `tokens` rows.
    pub fn scratch(&self, dev: &D, tokens: usize) -> DevResult<Scratch<D>> {
        let widths = Widths {
            ple: self.ple.as_ref().map_or(0, |p| p.width),
            ..Widths::of(&self.layers)
        };
        Scratch::new(dev, self.spec.hidden_size, widths, tokens)
    }

    /// Runs every layer over the step; `cap(id, x)` sees the residual stream for ids 0..=L in
    /// order. Leaves the last layer's (pre-norm) output in `s.x`.
    pub fn forward(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
        cap: &mut dyn FnMut(usize, &D::Buf) -> DevResult<()>,
    ) -> DevResult<()> {
        let norm = self.spec.row_norm();
        if let FinalNorm::Mixer(m) = &self.final_norm {
            return self.forward_hyper(dev, ctx, s, cap, m.streams);
        }
        self.embed(dev, ctx, &mut s.x)?;
        cap(0, &s.x)?;
        if let Some(ple) = &self.ple {
            ple.forward(dev, ctx.step, s)?;
        }
        let mut pending = false;
        for (i, layer) in self.layers.iter().enumerate() {
            for (j, part) in layer.parts.iter().enumerate() {
                match (&part.norm, pending) {
                    (Some(n), true) => dev.add_norm(&mut s.x, &s.proj, n, norm, &mut s.normed)?,
                    (Some(n), false) => dev.norm(&s.x, n, norm, &mut s.normed)?,
                    (None, pending) => {
                        if pending {
                            dev.add(&mut s.x, &s.proj)?;
                        }
                        // OLMo 2 / 3: the sublayer reads the stream (in the GEMM's dtype).
                        dev.cast(&s.x, &mut s.normed)?;
                    }
                }
                if j == 0 && i > 0 {
                    cap(i, &s.x)?;
                }
                pending = true;
                part.sublayer.forward(dev, ctx, s)?;
                if let Some(post_norm) = &part.post_norm {
                    let post = s.side.as_mut().ok_or_else(|| {
                        DeviceError::Invalid("post-norm without its buffer".into())
                    })?;
                    dev.norm(&s.proj, post_norm, norm, post)?;
                    std::mem::swap(&mut s.proj, post);
                }
                if part.residual_scale != 1.0 {
                    dev.scale(&mut s.proj, part.residual_scale)?;
                }
            }
            if layer.scale != 1.0 && pending {
                // transformers: `hidden_states *= layer_scalar` after the last residual add.
                dev.add(&mut s.x, &s.proj)?;
                dev.scale(&mut s.x, layer.scale)?;
                pending = false;
            }
        }
        if pending {
            dev.add(&mut s.x, &s.proj)?;
        }
        if !self.layers.is_empty() {
            cap(self.layers.len(), &s.x)?;
        }
        Ok(())
    }

    fn embed(&self, dev: &D, ctx: &Ctx<'_, '_, D>, out: &mut D::Buf) -> DevResult<()> {
        match &self.vocab {
            Vocab::Tied(m) => dev.embed(ctx.step, m, self.embed_scale, out),
            Vocab::Untied { table, .. } => dev.embed_table(ctx.step, table, self.embed_scale, out),
        }
    }

    /// [`Self::forward`] of a model with hyper-connections: the embedded rows copied into
    /// `streams` streams, every part between them through its connection.
    fn forward_hyper(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
        cap: &mut dyn FnMut(usize, &D::Buf) -> DevResult<()>,
        streams: usize,
    ) -> DevResult<()> {
        self.embed(dev, ctx, &mut s.proj)?;
        dev.hyper(HyperOp::Repeat {
            x: &s.proj,
            streams,
            out: &mut s.x,
        })?;
        for (i, layer) in self.layers.iter().enumerate() {
            cap(i, &s.x)?;
            for part in &layer.parts {
                match (&part.hyper, &part.sublayer) {
                    (Some(h), sub) => h.around(dev, s, |s| sub.forward(dev, ctx, s))?,
                    // It adds to the streams itself.
                    (None, sub @ Sublayer::Ngram(_)) => sub.forward(dev, ctx, s)?,
                    (None, _) => {
                        let msg = format!("layer {i}: a part without its hyper-connection");
                        return Err(DeviceError::Invalid(msg));
                    }
                }
            }
        }
        cap(self.layers.len(), &s.x)
    }

    /// The LM head's input `[n, hidden]` from `n` last-layer rows `x` (`[n, stream width]`).
    fn finish(&self, dev: &D, x: &D::Buf, n: usize, out: &mut D::Buf) -> DevResult<()> {
        match &self.final_norm {
            FinalNorm::Norm(w) => dev.norm(x, w, self.spec.row_norm(), out),
            FinalNorm::Mixer(m) => {
                let mut hs = HyperScratch::new(dev, m.dims(), n)?;
                m.mix(dev, x, &mut hs, out)
            }
        }
    }

    fn head(&self) -> &D::Linear {
        match &self.vocab {
            Vocab::Tied(m) | Vocab::Untied { head: m, .. } => m,
        }
    }

    /// Greedy tokens of rows `rows` of the pre-norm last-layer output `x`: the final norm, the
    /// LM head, argmax.
    pub fn greedy(&self, dev: &D, x: &D::Buf, rows: &[usize]) -> DevResult<Vec<u32>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let (n, h, v) = (rows.len(), self.spec.hidden_size, self.spec.vocab_size);
        let mut last = dev.buffer(n, self.spec.stream_width(), BufKind::F32)?;
        let mut normed = dev.buffer(n, h, BufKind::GemmIn)?;
        let mut logits = dev.buffer(n, v, BufKind::F32)?;
        dev.gather_rows(x, rows, &mut last)?;
        self.finish(dev, &last, n, &mut normed)?;
        dev.matmul(&normed, self.head(), &mut logits)?;
        dev.argmax(&logits)
    }

    /// The final norm (or mixer) of host rows `[n, stream width]` (id-L rows -> transformers'
    /// `hidden_states[L]`, `[n, hidden]`).
    pub fn final_norm(&self, dev: &D, rows: &[f32]) -> DevResult<Vec<f32>> {
        let (h, width) = (self.spec.hidden_size, self.spec.stream_width());
        let n = rows.len() / width;
        let mut x = dev.buffer(n, width, BufKind::F32)?;
        let mut out = dev.buffer(n, h, BufKind::F32)?;
        dev.upload(rows, width, &mut x)?;
        self.finish(dev, &x, n, &mut out)?;
        dev.download(&out)
    }
}

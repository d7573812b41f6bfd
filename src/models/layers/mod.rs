//! The building blocks every architecture is made of, generic over the [`Device`] ops: a
//! layer is one or two [`Part`]s (`x += sublayer(norm(x))`), a sublayer is attention, an MLP,
//! a MoE block, Gated DeltaNet (or Kimi Delta Attention), Mamba-1 or -2, two of these side by
//! side (Falcon-H1), or Gemma 4's per-layer input. Each reads the normed rows `s.normed` and leaves its output in `s.proj`.
//! The residual stream and the capture are in [`super::decoder`].
//!
//! [`Loader`] reads checkpoint tensors for the architecture files, which alone know the names.

pub mod attention;
pub mod gdn;
pub mod gemma4_moe;
pub mod gpt_oss_moe;
pub mod hyper;
pub mod kda;
pub mod mamba1;
pub mod mamba2;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod nemotron_moe;
pub mod ngram;
pub mod parallel;
pub mod per_layer_input;
pub mod short_conv;

use super::decoder::Vocab;
use super::{ModelError, Weights};
use crate::kernels::device::{
    BufKind, Cols, ConvCall, DevResult, DeviceError, HostMatrix, NormKind,
};
use crate::kernels::{Batch, Device};

pub use crate::kernels::device::SoftmaxVariant;
pub use attention::{Attention, QsaIndexer};
pub use gdn::GatedDeltaNet;
pub use gemma4_moe::Gemma4Moe;
pub use gpt_oss_moe::GptOssMoe;
pub use hyper::{HyperConnection, HyperScratch};
pub use kda::KimiDeltaAttention;
pub use mamba1::{Mamba1, Mamba1Dims, MixerNorm};
pub use mamba2::{Mamba2, OutNorm};
pub use mla::MlaAttention;
pub use mlp::Mlp;
pub use moe::Moe;
pub use nemotron_moe::NemotronMoe;
pub use ngram::{NgramEmbedding, NgramScratch};
pub use parallel::ParallelNormed;
pub use per_layer_input::{PerLayerEmbedding, PerLayerInput, PleScratch};
pub use short_conv::ShortConv;

/// What a sublayer needs of one forward beyond its scratch: the device's plan, the KV cache
/// and the recurrent-state slots.
pub struct Ctx<'s, 'a, D: Device> {
    /// The step's tokens and chunks, as the host sent them.
    pub batch: &'s Batch<'s>,
    pub step: &'s D::Step<'a>,
    pub kv: &'s mut D::Kv,
    pub states: Option<&'s mut D::States>,
}

impl<D: Device> Ctx<'_, '_, D> {
    /// The state slots (hybrid models; a model with recurrent layers always has them).
    pub fn states(&mut self) -> DevResult<&mut D::States> {
        self.states.as_deref_mut().ok_or_else(|| {
            crate::kernels::DeviceError::Invalid("recurrent layer without state slots".into())
        })
    }
}

/// The causal depthwise conv1d + SiLU that opens a recurrent layer, with its conv state
/// carried per request slot.
pub struct CausalConv<D: Device> {
    /// `[channels, kernel]`.
    pub weight: D::Vector,
    pub bias: Option<D::Vector>,
    pub kernel: usize,
    /// The layer's index among the recurrent layers.
    pub state_layer: usize,
    /// SiLU after the conv (Gated DeltaNet, Mamba-2, Qwen4-Exp's n-grams); none in LFM2's
    /// short convolution.
    pub silu: bool,
}

impl<D: Device> CausalConv<D> {
    /// Conv state floats per slot for `channels` channels.
    pub fn state_floats(&self, channels: usize) -> usize {
        (self.kernel - 1) * channels
    }

    /// `in_proj(s.normed)` into `s.wide`, then the conv of its columns `col..col + width` into
    /// `s.conv`.
    fn project(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        s: &mut Scratch<D>,
        in_proj: &D::Linear,
        (col, width): (usize, usize),
    ) -> DevResult<()> {
        dev.matmul(&s.normed, in_proj, &mut s.wide)?;
        self.run(dev, ctx, Cols::new(&s.wide, col, width), &mut s.conv)
    }

    /// The conv of `x` into `out`, advancing the request slots' windows.
    fn run(
        &self,
        dev: &D,
        ctx: &mut Ctx<'_, '_, D>,
        x: Cols<'_, D::Buf>,
        out: &mut D::Buf,
    ) -> DevResult<()> {
        let call = ConvCall {
            state_layer: self.state_layer,
            weight: &self.weight,
            bias: self.bias.as_ref(),
            kernel: self.kernel,
            silu: self.silu,
        };
        dev.conv1d(ctx.step, ctx.states()?, x, &call, out)
    }
}

/// One sublayer of a decoder layer.
pub enum Sublayer<D: Device> {
    Attention(Attention<D>),
    /// DeepSeek's multi-head latent attention.
    Mla(MlaAttention<D>),
    Mlp(Mlp<D>),
    Moe(Moe<D>),
    /// Nemotron 3's MoE block (group-limited sigmoid router, relu² experts).
    NemotronMoe(NemotronMoe<D>),
    GptOssMoe(GptOssMoe<D>),
    /// Gemma 4's dense MLP beside routed experts.
    Gemma4Moe(Gemma4Moe<D>),
    GatedDeltaNet(GatedDeltaNet<D>),
    /// Kimi Linear's Kimi Delta Attention.
    Kda(KimiDeltaAttention<D>),
    /// Mamba-1 (Mamba, Falcon-Mamba).
    Mamba1(Mamba1<D>),
    Mamba2(Mamba2<D>),
    /// LFM2's gated short convolution.
    ShortConv(ShortConv<D>),
    /// Two sublayers reading the same normed rows, their outputs summed (first + second):
    /// Falcon-H1's Mamba-2 beside its attention.
    Parallel(Box<[Sublayer<D>; 2]>),
    /// Two sublayers each after its own norm of the same rows, summed (GPT-NeoX).
    ParallelNormed(Box<ParallelNormed<D>>),
    /// Gemma 4 E2B / E4B's per-layer input.
    PerLayerInput(PerLayerInput<D>),
    /// Qwen4-Exp's hashed n-gram embeddings: added to the streams by the sublayer itself.
    Ngram(NgramEmbedding<D>),
}

impl<D: Device> Sublayer<D> {
    /// `s.proj` = the sublayer of `s.normed`.
    pub fn forward(&self, dev: &D, ctx: &mut Ctx<'_, '_, D>, s: &mut Scratch<D>) -> DevResult<()> {
        match self {
            Self::Parallel(pair) => {
                pair[0].forward(dev, ctx, s)?;
                let mut side = s.side.take().ok_or_else(|| {
                    DeviceError::Invalid("parallel sublayers without a side buffer".into())
                })?;
                std::mem::swap(&mut s.proj, &mut side);
                let second = pair[1].forward(dev, ctx, s);
                // transformers: `mamba_out + attention_out` (f32 addition commutes bit for bit).
                let sum = second.and_then(|()| dev.add(&mut s.proj, &side));
                s.side = Some(side);
                sum
            }
            Self::ParallelNormed(p) => p.forward(dev, ctx, s),
            Self::Attention(a) => a.forward(dev, ctx, s),
            Self::Mla(a) => a.forward(dev, ctx, s),
            Self::Mlp(m) => m.forward(dev, s),
            Self::Moe(m) => m.forward(dev, s),
            Self::NemotronMoe(m) => m.forward(dev, s),
            Self::GptOssMoe(m) => m.forward(dev, s),
            Self::Gemma4Moe(m) => m.forward(dev, s),
            Self::GatedDeltaNet(g) => g.forward(dev, ctx, s),
            Self::Kda(k) => k.forward(dev, ctx, s),
            Self::Mamba1(m) => m.forward(dev, ctx, s),
            Self::Mamba2(m) => m.forward(dev, ctx, s),
            Self::ShortConv(c) => c.forward(dev, ctx, s),
            Self::PerLayerInput(p) => p.forward(dev, s),
            Self::Ngram(n) => n.forward(dev, ctx, s),
        }
    }

    fn widths(&self) -> Widths {
        match self {
            Self::Attention(a) => a.widths(),
            Self::Mla(a) => a.widths(),
            Self::Mlp(m) => m.widths(),
            Self::Moe(m) => m.widths(),
            Self::NemotronMoe(m) => m.widths(),
            Self::GptOssMoe(m) => m.widths(),
            Self::Gemma4Moe(m) => m.widths(),
            Self::GatedDeltaNet(g) => g.widths(),
            Self::Kda(k) => k.widths(),
            Self::Mamba1(m) => m.widths(),
            Self::Mamba2(m) => m.widths(),
            Self::ShortConv(c) => c.widths(),
            Self::PerLayerInput(p) => p.widths(),
            Self::Ngram(n) => n.widths(),
            Self::Parallel(pair) => Widths {
                side: true,
                ..pair[0].widths().max(pair[1].widths())
            },
            Self::ParallelNormed(p) => Widths {
                side: true,
                ..p.first.widths().max(p.second.widths())
            },
        }
    }

    /// This sublayer, or the two of a [`Sublayer::Parallel`].
    pub fn leaves(&self) -> Vec<&Sublayer<D>> {
        match self {
            Self::Parallel(pair) => pair.iter().flat_map(|p| p.leaves()).collect(),
            Self::ParallelNormed(p) => [&p.first, &p.second]
                .into_iter()
                .flat_map(|p| p.leaves())
                .collect(),
            other => vec![other],
        }
    }
}

/// `x += sublayer(norm(x))`, or with a post-norm (Gemma's sandwich)
/// `x += post_norm(sublayer(norm(x)))`, or without a pre-norm (OLMo 2 / 3)
/// `x += post_norm(sublayer(x))`; the added rows times `residual_scale` (Granite's residual
/// multiplier; 1 for every other model, which changes no bit). With a hyper-connection
/// (Qwen4-Exp) the sublayer reads and adds to the model's streams through it instead
/// ([`HyperConnection`]; no norm).
pub struct Part<D: Device> {
    /// `None`: the sublayer reads the residual stream itself.
    pub norm: Option<D::Vector>,
    pub sublayer: Sublayer<D>,
    pub post_norm: Option<D::Vector>,
    pub residual_scale: f32,
    pub hyper: Option<HyperConnection<D>>,
}

impl<D: Device> Part<D> {
    /// `x += sublayer(norm(x))`.
    pub fn new(norm: D::Vector, sublayer: Sublayer<D>) -> Self {
        Self {
            norm: Some(norm),
            sublayer,
            post_norm: None,
            residual_scale: 1.0,
            hyper: None,
        }
    }

    /// `sublayer` between the streams through `hyper` (Qwen4-Exp).
    pub fn hyper(hyper: HyperConnection<D>, sublayer: Sublayer<D>) -> Self {
        Self {
            norm: None,
            sublayer,
            post_norm: None,
            residual_scale: 1.0,
            hyper: Some(hyper),
        }
    }

    /// `x += post_norm(sublayer(norm(x)))` (Gemma's and GLM-4's sandwich).
    pub fn sandwich(norm: D::Vector, sublayer: Sublayer<D>, post_norm: D::Vector) -> Self {
        Self {
            post_norm: Some(post_norm),
            ..Self::new(norm, sublayer)
        }
    }
}

/// One decoder layer (a layer id): its parts in order, then the residual stream times `scale`
/// (Gemma 4's `layer_scalar`; 1 for every other model, which changes no bit).
pub struct Layer<D: Device> {
    pub parts: Vec<Part<D>>,
    pub scale: f32,
}

/// Row widths (values per token) of the shared activation buffers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Widths {
    /// First projection (fused qkv, in_proj, gate_up).
    pub wide: usize,
    /// Conv output of the recurrent layers.
    pub conv: usize,
    /// Recurrence / attention output before its gate or norm (f32).
    pub mid: usize,
    /// Input of the output projection.
    pub act: usize,
    /// A second projection's output (f32): MLA's expanded latent.
    pub aux: usize,
    /// A third f32 buffer: Mamba-1's dt.
    pub dt: usize,
    /// MoE: (experts, top_k, expert intermediate size).
    pub moe: Option<(usize, usize, usize)>,
    /// A second `[T, hidden]` f32 buffer: some part norms its sublayer's output (Gemma), or a
    /// sublayer runs two side by side (Falcon-H1).
    pub side: bool,
    /// Per-layer embedding values per token (Gemma 4 E2B / E4B; 0: none).
    pub ple: usize,
    /// Hyper-connections' (streams, hidden, rank) (Qwen4-Exp; `None`: one residual stream).
    pub hyper: Option<(usize, usize, usize)>,
    /// N-gram embeddings' (embed_dim, streams · hidden, hidden) (Qwen4-Exp).
    pub ngram: Option<(usize, usize, usize)>,
}

impl Widths {
    fn max(self, o: Widths) -> Widths {
        let moe = match (self.moe, o.moe) {
            (Some(a), Some(b)) => Some((a.0.max(b.0), a.1.max(b.1), a.2.max(b.2))),
            (a, b) => a.or(b),
        };
        Widths {
            wide: self.wide.max(o.wide),
            conv: self.conv.max(o.conv),
            mid: self.mid.max(o.mid),
            act: self.act.max(o.act),
            aux: self.aux.max(o.aux),
            dt: self.dt.max(o.dt),
            moe,
            side: self.side || o.side,
            ple: self.ple.max(o.ple),
            hyper: self.hyper.max(o.hyper),
            ngram: self.ngram.max(o.ngram),
        }
    }

    /// The widths every layer of `layers` fits in.
    pub fn of<D: Device>(layers: &[Layer<D>]) -> Widths {
        let part = |p: &Part<D>| {
            let w = p.sublayer.widths();
            let hyper = p.hyper.as_ref().map_or(Widths::default(), |h| h.widths());
            Widths {
                side: w.side || p.post_norm.is_some(),
                ..w.max(hyper)
            }
        };
        (layers.iter().flat_map(|l| &l.parts)).fold(Widths::default(), |w, p| w.max(part(p)))
    }
}

/// Activation buffers shared by every layer, made once for the token budget.
pub struct Scratch<D: Device> {
    /// The residual stream `[T, hidden]` (`[T, streams · hidden]` with hyper-connections), f32.
    pub x: D::Buf,
    pub normed: D::Buf,
    /// A sublayer's output `[T, hidden]`, f32.
    pub proj: D::Buf,
    /// `proj`'s twin, f32: `proj` post-normed (swapped into `proj`) or a parallel sublayer's
    /// first output (only for models with post-norms or parallel sublayers).
    pub side: Option<D::Buf>,
    pub wide: D::Buf,
    pub conv: D::Buf,
    pub mid: D::Buf,
    pub act: D::Buf,
    pub aux: D::Buf,
    pub dt: D::Buf,
    pub moe: Option<MoeScratch<D>>,
    pub ple: Option<PleScratch<D>>,
    pub hyper: Option<HyperScratch<D>>,
    pub ngram: Option<NgramScratch<D>>,
}

/// The MoE blocks' buffers (`top_k` rows per token for the experts).
pub struct MoeScratch<D: Device> {
    pub logits: D::Buf,
    pub rows: D::Buf,
    pub gate_up: D::Buf,
    pub act: D::Buf,
    pub out: D::Buf,
    pub shared: D::Buf,
    pub gate: D::Buf,
}

impl<D: Device> MoeScratch<D> {
    /// The MoE buffers a MoE block runs in (made with the scratch when a layer has experts).
    pub(super) fn of(moe: &mut Option<Self>) -> DevResult<&mut Self> {
        moe.as_mut()
            .ok_or_else(|| DeviceError::Invalid("MoE block without MoE buffers".into()))
    }
}

impl<D: Device> Scratch<D> {
    /// Buffers for `t` tokens of `hidden` and the layers' `w`idths.
    pub fn new(dev: &D, hidden: usize, w: Widths, t: usize) -> DevResult<Self> {
        use BufKind::{F32, GemmIn};
        let moe = match w.moe {
            Some((experts, k, inter)) => {
                let n = t.saturating_mul(k);
                Some(MoeScratch {
                    logits: dev.buffer(t, experts, F32)?,
                    rows: dev.buffer(n, hidden, GemmIn)?,
                    gate_up: dev.buffer(n, 2 * inter, F32)?,
                    act: dev.buffer(n, inter, GemmIn)?,
                    out: dev.buffer(n, hidden, F32)?,
                    shared: dev.buffer(t, hidden, F32)?,
                    gate: dev.buffer(t, 1, F32)?,
                })
            }
            None => None,
        };
        let streams = w.hyper.map_or(1, |(s, _, _)| s);
        Ok(Self {
            x: dev.buffer(t, streams * hidden, F32)?,
            normed: dev.buffer(t, hidden, GemmIn)?,
            proj: dev.buffer(t, hidden, F32)?,
            side: match w.side {
                true => Some(dev.buffer(t, hidden, F32)?),
                false => None,
            },
            wide: dev.buffer(t, w.wide, F32)?,
            conv: dev.buffer(t, w.conv, F32)?,
            mid: dev.buffer(t, w.mid, F32)?,
            act: dev.buffer(t, w.act, GemmIn)?,
            aux: dev.buffer(t, w.aux, F32)?,
            dt: dev.buffer(t, w.dt, F32)?,
            moe,
            ple: match w.ple {
                0 => None,
                n => Some(PleScratch {
                    inputs: dev.buffer(t, n, F32)?,
                    tmp: dev.buffer(t, n, F32)?,
                }),
            },
            hyper: w.hyper.map(|d| HyperScratch::new(dev, d, t)).transpose()?,
            ngram: w.ngram.map(|d| NgramScratch::new(dev, d, t)).transpose()?,
        })
    }
}

/// Reads checkpoint tensors onto a device.
pub struct Loader<'a, D: Device> {
    pub dev: &'a D,
    pub w: &'a Weights,
}

impl<'a, D: Device> Loader<'a, D> {
    /// A `[rows, cols]` matrix as stored.
    pub fn matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<HostMatrix<'a>, ModelError> {
        self.w.matrix(name, rows, cols)
    }

    /// The gather-only embedding table `{name}.weight` (`[rows, cols]`), read where it lies.
    pub fn table(&self, name: &str, rows: usize, cols: usize) -> Result<D::Table, ModelError> {
        let table = self.w.table(&format!("{name}.weight"), rows, cols)?;
        Ok(self.dev.table(table)?)
    }

    /// `{name}.weight` `[heads · width, cols]` (and `{name}.bias` where `bias`, else no
    /// values) with each head's `width` rows `repeat` times over: KV heads repeated to fill a
    /// cache of more heads (the same keys and values).
    pub fn repeated_heads(
        &self,
        name: &str,
        (heads, width, repeat): (usize, usize, usize),
        cols: usize,
        bias: bool,
    ) -> Result<(HostMatrix<'static>, Vec<f32>), ModelError> {
        let ranges: Vec<(usize, usize)> = (0..heads)
            .flat_map(|j| std::iter::repeat_n((j * width, width), repeat))
            .collect();
        self.selected_rows(name, (heads * width, cols), &ranges, bias)
    }

    /// The rows `ranges` (start, count; in the order given) of `{name}.weight`
    /// `[rows, cols]`, and of `{name}.bias` where `bias` (else no values).
    pub fn selected_rows(
        &self,
        name: &str,
        (rows, cols): (usize, usize),
        ranges: &[(usize, usize)],
        bias: bool,
    ) -> Result<(HostMatrix<'static>, Vec<f32>), ModelError> {
        let m = self.matrix(&format!("{name}.weight"), rows, cols)?;
        let b = match bias {
            true => {
                let b = self.f32s(&format!("{name}.bias"), &[rows])?;
                (ranges.iter())
                    .flat_map(|&(s, n)| b[s..s + n].to_vec())
                    .collect()
            }
            false => Vec::new(),
        };
        Ok((m.select_rows(ranges), b))
    }

    /// An f32 tensor of `shape`.
    pub fn f32s(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.w.tensor(name, shape)
    }

    /// An f32 vector of `n` values on the device.
    pub fn vector(&self, name: &str, n: usize) -> Result<D::Vector, ModelError> {
        Ok(self.dev.vector(&self.f32s(name, &[n])?)?)
    }

    /// The weights of the norm `name` (`n` wide) as a norm of `kind` takes them:
    /// `{name}.weight`, followed by `{name}.bias` where the kind has one.
    pub fn norm(&self, name: &str, n: usize, kind: NormKind) -> Result<D::Vector, ModelError> {
        let mut w = self.f32s(&format!("{name}.weight"), &[n])?;
        if kind == NormKind::LayerBias {
            w.extend(self.f32s(&format!("{name}.bias"), &[n])?);
        }
        Ok(self.dev.vector(&w)?)
    }

    /// A zero-centred RMSNorm's `1 + w` of `{name}.weight` (`n` values: Qwen3.5's, Gemma's).
    pub fn norm_one_plus(&self, name: &str, n: usize) -> Result<D::Vector, ModelError> {
        let w = one_plus(self.f32s(&format!("{name}.weight"), &[n])?);
        Ok(self.dev.vector(&w)?)
    }

    /// `{name}.weight` `[rows, cols]` of each part stacked into one linear layer, with the
    /// parts' `{name}.bias` when `bias`.
    pub fn linear(
        &self,
        parts: &[(String, usize)],
        cols: usize,
        bias: bool,
    ) -> Result<D::Linear, ModelError> {
        let mut mats = Vec::with_capacity(parts.len());
        let mut b = Vec::new();
        for (name, rows) in parts {
            mats.push(self.matrix(&format!("{name}.weight"), *rows, cols)?);
            if bias {
                b.extend(self.f32s(&format!("{name}.bias"), &[*rows])?);
            }
        }
        let m = HostMatrix::stack(mats).map_err(ModelError::Device)?;
        Ok(self.dev.linear(m, bias.then_some(b))?)
    }

    /// The embedding `{embed}.weight` and the head: one matrix when tied, else a gather-only
    /// table (read where the checkpoint maps it, on the CPU) and `lm_head.weight`.
    pub fn vocab(&self, spec: &super::ModelSpec, embed: &str) -> Result<Vocab<D>, ModelError> {
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        Ok(match spec.tie_word_embeddings {
            true => Vocab::Tied(self.linear1(embed, v, h, false)?),
            false => Vocab::Untied {
                table: self.table(embed, v, h)?,
                head: self.linear1("lm_head", v, h, false)?,
            },
        })
    }

    /// One `{name}.weight` `[rows, cols]` (+ bias).
    pub fn linear1(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        bias: bool,
    ) -> Result<D::Linear, ModelError> {
        self.linear(&[(name.to_string(), rows)], cols, bias)
    }
}

/// `1 + w` of a zero-centred RMSNorm (computed once in f32, as transformers does per call).
fn one_plus(mut w: Vec<f32>) -> Vec<f32> {
    for v in &mut w {
        *v += 1.0;
    }
    w
}

/// `-exp(A_log)` per head.
pub fn neg_exp(a_log: &[f32]) -> Vec<f32> {
    a_log.iter().map(|&v| -v.exp()).collect()
}

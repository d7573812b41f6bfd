//! The attention ops' types (re-exported by `device.rs`): where q, k and v sit in a fused
//! projection, the head geometry, an attention layer's call and its softmax's variant.

use super::{Device, DeviceError};

/// Where q, k and v sit in a fused projection's rows: q heads from column 0, k heads from
/// `k_col`, v heads right after k.
#[derive(Debug, Clone, Copy)]
pub struct QkvLayout {
    pub k_col: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl QkvLayout {
    pub fn v_col(&self) -> usize {
        self.k_col + self.kv_heads * self.head_dim
    }

    /// The row width this layout reads: up to v's last column, or to `k_col` where the layer
    /// shares an earlier layer's keys and values (its rows hold q only).
    pub fn width(&self, shared_kv: bool) -> usize {
        match shared_kv {
            true => self.k_col,
            false => self.v_col() + self.kv_heads * self.head_dim,
        }
    }

    /// The pieces (count, width) of each row's q and of its k that q / k RMSNorm weights of
    /// `lens` values norm one by one: every head (Qwen3: `head_dim` values) or the whole
    /// projection (OLMo-2, MiniMax-M2: `heads · head_dim`); an error for any other length. A
    /// layer with no k weights (it shares an earlier layer's keys) has no k pieces: `(0, 0)`.
    pub fn norm_pieces(&self, lens: (usize, Option<usize>)) -> Result<[(usize, usize); 2], String> {
        self.norm_pieces_of(QkNormForm::Rms, lens)
    }

    /// [`Self::norm_pieces`] of weights applied as `form` says: with
    /// [`QkNormForm::HeadLayerNorm`] every head, its weights a row of `heads · head_dim`.
    pub fn norm_pieces_of(
        &self,
        form: QkNormForm,
        lens: (usize, Option<usize>),
    ) -> Result<[(usize, usize); 2], String> {
        let hd = self.head_dim;
        let per_head = form == QkNormForm::HeadLayerNorm;
        let piece = |len: usize, heads: usize, what: &str| match len {
            _ if per_head && len == heads * hd => Ok((heads, hd)),
            _ if per_head => Err(format!(
                "{what} of {len} values for {heads} heads of {hd}: not a row per head"
            )),
            _ if len == hd => Ok((heads, hd)),
            _ if len == heads * hd => Ok((1, len)),
            _ => Err(format!(
                "{what} of {len} values for {heads} heads of {hd}: neither a head nor all"
            )),
        };
        Ok([
            piece(lens.0, self.heads, "q_norm")?,
            match lens.1 {
                Some(k) => piece(k, self.kv_heads, "k_norm")?,
                None => (0, 0),
            },
        ])
    }
}

/// Head geometry of one attention layer, as every device's attention kernel takes it.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale, `head_dim^-0.5` (computed in f64, rounded to f32).
    pub scale: f32,
}

impl AttnShape {
    pub fn new(heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self {
            heads,
            kv_heads,
            head_dim,
            scale: (head_dim as f64).powf(-0.5) as f32,
        }
    }
}

/// q's RMSNorm weights, k's where the layer has keys of its own, and eps.
pub type QkNormWeights<'a, V> = (&'a V, Option<&'a V>, f64);

/// How an attention layer's q / k norm weights apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QkNormForm {
    /// RMSNorm of pieces as wide as the weights (each head: Qwen3; the whole projection:
    /// MiniMax-M2), before RoPE.
    #[default]
    Rms,
    /// The same after RoPE (HunYuan's).
    RmsAfterRope,
    /// LayerNorm without a bias (centred) of each head, its weights the head's row of
    /// `[heads, head_dim]`, before RoPE: Cohere's `use_qk_norm` (Command R+).
    HeadLayerNorm,
}

impl QkNormForm {
    pub fn after_rope(self) -> bool {
        self == Self::RmsAfterRope
    }
}

/// One attention layer's call: its KV cache layer, the qkv layout, optional q/k RMSNorm
/// weights (per head or over the whole projection: [`QkvLayout::norm_pieces`]), an optional
/// per-head RMSNorm of v (Gemma 4's, unweighted: its weights are ones) and RoPE (table, rotary
/// dims of each head), and the softmax's variant.
pub struct AttnCall<'a, D: Device> {
    pub kv_layer: usize,
    pub layout: QkvLayout,
    /// q's weights, k's (none exactly where the layer shares keys: `shared_kv`), and eps.
    pub qk_norm: Option<QkNormWeights<'a, D::Vector>>,
    /// How the q / k norm weights apply.
    pub norm_form: QkNormForm,
    /// `[head_dim]` weights and eps.
    pub v_norm: Option<(&'a D::Vector, f64)>,
    pub rope: Option<(&'a D::Rope, usize)>,
    pub softmax: AttnSoftmax<'a, D>,
    /// The layer attends over the keys and values an earlier layer wrote to `kv_layer` (Gemma
    /// 4's KV sharing): its rows hold q (and its gate) only, it writes no K / V, and k's norm
    /// weights and `v_norm` are not read.
    pub shared_kv: bool,
}

impl<D: Device> AttnCall<'_, D> {
    /// The (count, width) of the pieces of q and of k its q / k norm weights norm
    /// ([`QkvLayout::norm_pieces`]), where it has them: k's weights are given exactly where the
    /// layer has keys of its own (not `shared_kv`). `len`: a weight vector's length.
    pub fn norm_pieces(
        &self,
        len: impl Fn(&D::Vector) -> usize,
    ) -> Result<Option<[(usize, usize); 2]>, DeviceError> {
        let Some((q, k, _)) = self.qk_norm else {
            return Ok(None);
        };
        if k.is_some() == self.shared_kv {
            return Err(DeviceError::Invalid(match self.shared_kv {
                true => "k_norm weights on a layer that shares an earlier layer's keys".into(),
                false => "q_norm without k_norm weights on a layer with keys".into(),
            }));
        }
        let pieces = self
            .layout
            .norm_pieces_of(self.norm_form, (len(q), k.map(len)));
        pieces.map(Some).map_err(DeviceError::Invalid)
    }
}

/// What the attention's softmax sees beyond the causal keys: a sliding window (gpt-oss,
/// Mistral: query at position p sees keys `p - window + 1 ..= p`) or Llama-4's chunks (keys
/// `p - p % chunk ..= p`), a learned per-head sink logit that joins the denominator only, a
/// factor on the scores on top of `head_dim^-0.5` (Gemma-3's `query_pre_attn_scalar`, Granite's
/// attention multiplier, MLA's YaRN mscale²; YaRN's attention factor is on the RoPE table), and
/// a per-position query temperature (Llama-4's NoPE layers; every layer of Ministral 3 and
/// Mistral 4), and a tanh soft cap on the scaled scores (Gemma-2's `attn_logit_softcapping`:
/// `cap · tanh(s / cap)`, before the mask and the softmax). `S`: how the sinks are held, owned by a model's layer
/// (`SoftmaxVariant<D::Vector>`) or borrowed into a call ([`AttnSoftmax`]).
pub struct SoftmaxVariant<S> {
    pub window: Option<usize>,
    pub chunk: Option<usize>,
    /// `[heads]` logits.
    pub sinks: Option<S>,
    pub score_factor: f64,
    pub temperature: Option<QueryTemperature>,
    /// `cap`: each scaled score `s` becomes `cap · tanh(s / cap)` (f32).
    pub softcap: Option<f32>,
    /// DeepSeek Sparse Attention's `index_topk`: a token at a position ≥ it (more keys than
    /// it) attends over the keys the last [`Device::dsa_select`] chose, the rest densely.
    pub sparse: Option<usize>,
}

/// The softmax variant of one attention call, its sinks borrowed.
pub type AttnSoftmax<'a, D> = SoftmaxVariant<&'a <D as Device>::Vector>;

/// A per-position factor on the query after RoPE and norm,
/// `log1p(floor((p + offset) / floor_scale)) · attn_scale + 1` in f32 as transformers computes
/// it (1 exactly while `p + offset < floor_scale`): Llama-4's attention temperature tuning (its
/// NoPE layers; `offset` 1) and the "Llama-4 attention scale" of Ministral 3 / Devstral 2 and
/// Mistral 4 (every layer; `offset` 0, `floor_scale` the original context, `attn_scale`
/// `llama_4_scaling_beta`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryTemperature {
    pub floor_scale: f32,
    pub attn_scale: f32,
    pub offset: f32,
}

impl QueryTemperature {
    /// The factor on the query at position `p`.
    pub fn factor(&self, p: usize) -> f32 {
        ((p as f32 + self.offset) / self.floor_scale)
            .floor()
            .ln_1p()
            * self.attn_scale
            + 1.0
    }
}

/// First key a query at position `p` sees: the window's or the chunk's start (0 for neither).
pub fn first_key(p: usize, window: Option<usize>, chunk: Option<usize>) -> usize {
    match (window, chunk) {
        (Some(w), _) => (p + 1).saturating_sub(w),
        (None, Some(c)) if c > 0 => p - p % c,
        _ => 0,
    }
}

impl<S> SoftmaxVariant<S> {
    /// Plain causal softmax.
    pub fn causal() -> Self {
        Self {
            window: None,
            chunk: None,
            sinks: None,
            score_factor: 1.0,
            temperature: None,
            softcap: None,
            sparse: None,
        }
    }

    /// The variant's sizes make sense: a window or a chunk of at least one key (not both), a
    /// positive floor scale, a finite positive soft cap; sparse attention with none of the
    /// others (its kernels take none).
    pub fn check(&self) -> Result<(), DeviceError> {
        let cold =
            (self.temperature).is_some_and(|t| t.floor_scale.is_nan() || t.floor_scale < 1.0);
        let bad_cap = self.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0));
        let other = self.sinks.is_some() || self.temperature.is_some() || self.softcap.is_some();
        let bad = match (self.window, self.chunk) {
            (Some(0), _) | (_, Some(0)) => Some("attention window or chunk of 0 keys"),
            (Some(_), Some(_)) => Some("attention with both a sliding window and chunks"),
            _ if cold => Some("temperature floor_scale below 1"),
            _ if bad_cap => Some("attention soft cap not a finite value above 0"),
            (w, c) if self.sparse.is_some() && (w.is_some() || c.is_some() || other) => {
                Some("sparse attention with a window, chunks, sinks, a temperature or a soft cap")
            }
            _ => None,
        };
        bad.map_or(Ok(()), |m| Err(DeviceError::Invalid(m.into())))
    }

    /// The same variant, its sinks borrowed (a layer's variant into its call).
    pub fn as_ref(&self) -> SoftmaxVariant<&S> {
        SoftmaxVariant {
            window: self.window,
            chunk: self.chunk,
            sinks: self.sinks.as_ref(),
            score_factor: self.score_factor,
            temperature: self.temperature,
            softcap: self.softcap,
            sparse: self.sparse,
        }
    }

    /// The head geometry with the scale `head_dim^-0.5 · score_factor` (f64, rounded once).
    pub fn shape(&self, heads: usize, kv_heads: usize, head_dim: usize) -> AttnShape {
        AttnShape {
            scale: ((head_dim as f64).powf(-0.5) * self.score_factor) as f32,
            ..AttnShape::new(heads, kv_heads, head_dim)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AttnCall, QkNormForm, QkvLayout, SoftmaxVariant};
    use crate::kernels::CpuDevice;

    const LAYOUT: QkvLayout = QkvLayout {
        k_col: 48,
        heads: 6,
        kv_heads: 2,
        head_dim: 8,
    };

    #[test]
    fn qk_norm_pieces_are_heads_or_the_whole_projection() {
        let l = QkvLayout {
            k_col: 48,
            heads: 6,
            kv_heads: 2,
            head_dim: 8,
        };
        assert_eq!(l.norm_pieces((8, Some(8))), Ok([(6, 8), (2, 8)]));
        assert_eq!(l.norm_pieces((48, Some(16))), Ok([(1, 48), (1, 16)]));
        assert!(
            l.norm_pieces((48, Some(8))).is_ok(),
            "each weight on its own"
        );
        assert_eq!(l.norm_pieces((8, None)), Ok([(6, 8), (0, 0)]), "no keys");
        let err = l.norm_pieces((8, Some(24))).unwrap_err();
        assert!(err.contains("k_norm of 24 values"), "{err}");
        assert!(l.norm_pieces((16, Some(8))).is_err());
    }

    /// A call on `LAYOUT` with q norm weights `q`, k's `k`, sharing keys or not.
    fn call_with<'a>(
        q: &'a Vec<f32>,
        k: Option<&'a Vec<f32>>,
        shared_kv: bool,
    ) -> AttnCall<'a, CpuDevice> {
        AttnCall {
            kv_layer: 0,
            layout: LAYOUT,
            qk_norm: Some((q, k, 1e-6)),
            norm_form: QkNormForm::Rms,
            v_norm: None,
            rope: None,
            softmax: SoftmaxVariant::causal(),
            shared_kv,
        }
    }

    /// k's norm weights are given exactly where the layer has keys of its own.
    #[test]
    fn k_norm_weights_exactly_where_the_layer_has_keys() {
        let (q, k) = (vec![1.0; 8], vec![1.0; 16]);
        let pieces =
            |c: AttnCall<'_, CpuDevice>| c.norm_pieces(|w| w.len()).map_err(|e| e.to_string());
        assert_eq!(
            pieces(call_with(&q, Some(&k), false)),
            Ok(Some([(6, 8), (1, 16)]))
        );
        assert_eq!(
            pieces(call_with(&q, None, true)),
            Ok(Some([(6, 8), (0, 0)]))
        );
        let err = pieces(call_with(&q, Some(&k), true)).unwrap_err();
        assert!(
            err.contains("k_norm weights on a layer that shares"),
            "{err}"
        );
        let err = pieces(call_with(&q, None, false)).unwrap_err();
        assert!(err.contains("q_norm without k_norm"), "{err}");
        let none = AttnCall {
            qk_norm: None,
            norm_form: QkNormForm::Rms,
            ..call_with(&q, None, true)
        };
        assert_eq!(pieces(none), Ok(None));
        // Cohere's: a row of weights per head, any other length refused.
        let (q, k) = (vec![1.0; 48], vec![1.0; 16]);
        let rows = AttnCall {
            norm_form: QkNormForm::HeadLayerNorm,
            ..call_with(&q, Some(&k), false)
        };
        assert_eq!(pieces(rows), Ok(Some([(6, 8), (2, 8)])));
        let short = vec![1.0; 8];
        let one_head = AttnCall {
            norm_form: QkNormForm::HeadLayerNorm,
            ..call_with(&short, Some(&k), false)
        };
        let err = pieces(one_head).unwrap_err();
        assert!(err.contains("not a row per head"), "{err}");
    }

    /// A KV-sharing layer's rows end where k would start.
    #[test]
    fn rows_read_up_to_v_or_k() {
        let l = QkvLayout {
            k_col: 48,
            heads: 6,
            kv_heads: 2,
            head_dim: 8,
        };
        assert_eq!((l.v_col(), l.width(false), l.width(true)), (64, 80, 48));
    }
}

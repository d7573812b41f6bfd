//! MiMo-V2-Flash (`MiMoV2FlashForCausalLM`, `model.*` checkpoint names).
//!
//! Per layer: `input_layernorm` -> attention -> `post_attention_layernorm` -> a SwiGLU MLP or
//! the MoE block (`mlp.gate` with `gate.e_score_correction_bias`, experts `mlp.experts.{e}.*`:
//! DeepSeek-V3's grouped sigmoid router, no shared expert), as [`super::dense`] reads them.
//!
//! The attention: q and k heads of `head_dim`, v heads of `v_head_dim` (192 / 128 released),
//! every value times `attention_value_scale`; the first `int(head_dim · 0.334)` dims of each
//! head rotated by its kind's RoPE; sliding layers with their window, twice the KV heads and
//! learned sinks (`self_attn.attention_sink_bias`, as released and as transformers saves them).
//! The attention kernels take one head size, so each KV head's `v_proj` rows are followed by
//! zero rows up to `head_dim` and `o_proj` has zero columns to match (a padded value dim is 0
//! in every output, and meets a zero weight); the KV cache holds the larger kind's KV heads,
//! the other kind's heads repeated to fill it (their projection rows read twice: the same
//! keys and values). The multi-token-prediction layers (`model.mtp.*`) are not read.

use super::config::MimoSpec;
use super::decoder::Decoder;
use super::layers::{Attention, Loader, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let m = spec.mimo.clone().ok_or_else(|| {
        ModelError::InvalidOptions("MiMoV2FlashForCausalLM spec without its MiMo fields".into())
    })?;
    super::dense::load_with(ld, spec, |ld, spec, i| {
        let p = format!("model.layers.{i}");
        let attention = Sublayer::Attention(load_attention(ld, spec, &m, i)?);
        let ffn = super::dense::load_ffn(ld, spec, &p, i)?;
        super::dense::attention_layer(ld, spec, &p, attention, ffn)
    })
}

fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    m: &MimoSpec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let attn = |n: &str| format!("model.layers.{i}.self_attn.{n}");
    let (h, heads, hd, vd) = (
        spec.hidden_size,
        spec.num_heads,
        spec.head_dim,
        m.v_head_dim,
    );
    let kind = m.kind(i);
    let kv = m.kv_heads[kind];
    // The config parser checked that it divides.
    let repeat = spec.num_kv_heads / kv;
    let proj = Projections {
        ld,
        bias: spec.qkv_bias,
        hidden: h,
        kv,
        repeat,
    };
    let q = proj.part(&attn("q_proj"), (heads * hd, None))?;
    let k = proj.part(&attn("k_proj"), (hd, Some(hd)))?;
    let v = proj.part(&attn("v_proj"), (vd, Some(hd)))?;
    let (mats, bias): (Vec<_>, Vec<_>) = [q, k, v].into_iter().unzip();
    let qkv = HostMatrix::stack(mats).map_err(ModelError::Device)?;
    let qkv = ld.dev.linear(qkv, spec.qkv_bias.then(|| bias.concat()))?;
    let o = ld.matrix(&attn("o_proj.weight"), h, heads * vd)?;
    let (theta, scaling, rot) = m.rope[kind];
    let rope = Rope::new(rot, theta, scaling);
    let sinks = match m.sinks[kind] {
        true => Some(ld.vector(&attn("attention_sink_bias"), heads)?),
        false => None,
    };
    Ok(Attention {
        qkv,
        o: ld.dev.linear(o.pad_col_groups(heads, vd, hd), None)?,
        qk_norm: None,
        v_norm: None,
        rope: Some((ld.dev.rope_table(&rope)?, rot)),
        gated: false,
        heads,
        kv_heads: kv * repeat,
        head_dim: hd,
        eps: spec.rms_norm_eps,
        kv_layer: i,
        shared_kv: false,
        variant: SoftmaxVariant {
            window: m.sliding[i].then_some(m.window),
            sinks,
            ..SoftmaxVariant::causal()
        },
        qsa: None,
        value_scale: Some(m.value_scale),
    })
}

/// How one layer's q / k / v projections are read: `kv` KV heads, each repeated `repeat`
/// times to fill the cache.
struct Projections<'l, 'a, D: Device> {
    ld: &'l Loader<'a, D>,
    bias: bool,
    hidden: usize,
    kv: usize,
    repeat: usize,
}

impl<'a, D: Device> Projections<'_, 'a, D> {
    /// `{name}.weight` (and bias) as fused rows: q's as stored (`(rows, None)`); a KV
    /// projection's (`(width, Some(to))`) per KV head, `repeat` times over, each head's
    /// `width` rows followed by zero rows up to `to`.
    fn part(
        &self,
        name: &str,
        (width, to): (usize, Option<usize>),
    ) -> Result<(HostMatrix<'a>, Vec<f32>), ModelError> {
        let rows = match to {
            Some(_) => self.kv * width,
            None => width,
        };
        let m = self
            .ld
            .matrix(&format!("{name}.weight"), rows, self.hidden)?;
        let b = match self.bias {
            true => self.ld.f32s(&format!("{name}.bias"), &[rows])?,
            false => Vec::new(),
        };
        let Some(to) = to else {
            return Ok((m, b));
        };
        let heads = self.kv * self.repeat;
        let ranges: Vec<(usize, usize)> = (0..self.kv)
            .flat_map(|j| std::iter::repeat_n((j * width, width), self.repeat))
            .collect();
        let padded_bias = match self.bias {
            true => (ranges.iter())
                .flat_map(|&(s, n)| b[s..s + n].iter().copied().chain(vec![0.0; to - width]))
                .collect(),
            false => Vec::new(),
        };
        let m = m.select_rows(&ranges).pad_row_groups(heads, width, to);
        Ok((m, padded_bias))
    }
}

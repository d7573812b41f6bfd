//! gpt-oss (`GptOssForCausalLM`, `model.*` checkpoint names).
//!
//! Per layer: `input_layernorm` -> attention (biased q/k/v/o, YaRN RoPE, per-head sinks
//! `self_attn.sinks`, a sliding window on `sliding_attention` layers) ->
//! `post_attention_layernorm` -> the MoE block ([`GptOssMoe`]).
//!
//! Experts on disk, one tensor for all experts of a layer:
//! - plain (bf16 / f32 exports): `mlp.experts.gate_up_proj` `[E, hidden, 2I]` and `down_proj`
//!   `[E, I, hidden]` (transformers multiplies `x @ W`, so each is transposed here), biases
//!   `gate_up_proj_bias` `[E, 2I]`, `down_proj_bias` `[E, hidden]`;
//! - MXFP4 (OpenAI's releases): `*_blocks` `[E, out, in / 32, 16]` + `*_scales`
//!   `[E, out, in / 32]` (already `[out, in]`), dequantised by [`super::mxfp4`].
//!
//! The gate and up outputs are interleaved (`gate_up[..., ::2]` is the gate): their rows are
//! de-interleaved into `[gate | up]` at load, so the activation reads two halves.

use super::decoder::Decoder;
use super::gpt_oss_config::GptOssSpec;
use super::layers::moe::Expert;
use super::layers::{Attention, GptOssMoe, Layer, Loader, Part, SoftmaxVariant, Sublayer};
use super::{ModelError, ModelSpec, mxfp4};
use crate::kernels::Device;
use crate::kernels::device::HostMatrix;
use crate::kernels::dtype::WeightDtype;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let g = spec.gpt_oss.clone().ok_or_else(|| {
        ModelError::InvalidOptions("GptOssForCausalLM spec without its gpt-oss fields".into())
    })?;
    super::dense::load_with(ld, spec, |ld, spec, i| load_layer(ld, spec, &g, i))
}

fn load_layer<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &GptOssSpec,
    i: usize,
) -> Result<Layer<D>, ModelError> {
    let p = format!("model.layers.{i}");
    let h = spec.hidden_size;
    Ok(Layer {
        parts: vec![
            Part::new(
                ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
                Sublayer::Attention(load_attention(ld, spec, g, i)?),
            ),
            Part::new(
                ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                Sublayer::GptOssMoe(load_moe(ld, spec, g, &format!("{p}.mlp"))?),
            ),
        ],
        scale: 1.0,
    })
}

fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &GptOssSpec,
    i: usize,
) -> Result<Attention<D>, ModelError> {
    let sinks = format!("model.layers.{i}.self_attn.sinks");
    let variant = SoftmaxVariant {
        window: g.windows[i],
        sinks: Some(ld.vector(&sinks, spec.num_heads)?),
        ..SoftmaxVariant::causal()
    };
    super::dense::load_attention(ld, spec, i, variant)
}

fn load_moe<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    g: &GptOssSpec,
    p: &str,
) -> Result<GptOssMoe<D>, ModelError> {
    let (h, inter, e) = (spec.hidden_size, spec.intermediate_size, g.num_experts);
    let n = |s: &str| format!("{p}.experts.{s}");
    let gate_up_bias = ld.f32s(&n("gate_up_proj_bias"), &[e, 2 * inter])?;
    let down_bias = ld.f32s(&n("down_proj_bias"), &[e, h])?;
    let weights = ExpertWeights::open(ld, (g.mxfp4, spec.dtype), p, (h, inter, e))?;
    let experts = (0..e)
        .map(|x| {
            let (gate_up, down) = weights.expert(x)?;
            let b = &gate_up_bias[x * 2 * inter..(x + 1) * 2 * inter];
            let b: Vec<f32> = (0..2)
                .flat_map(|half| b.iter().skip(half).step_by(2))
                .copied()
                .collect();
            Ok(Expert {
                gate_up: ld.dev.linear(gate_up, Some(b))?,
                down: ld
                    .dev
                    .linear(down, Some(down_bias[x * h..(x + 1) * h].to_vec()))?,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(GptOssMoe {
        router: ld.linear1(&format!("{p}.router"), e, h, true)?,
        experts,
        top_k: g.top_k,
        inter,
        hidden: h,
        alpha: g.swiglu_alpha as f32,
        limit: g.swiglu_limit as f32,
    })
}

/// One layer's expert projections as stored: plain `[E, in, out]` tensors, or MXFP4.
enum ExpertWeights<'a> {
    Plain {
        gate_up: HostMatrix<'a>,
        down: HostMatrix<'a>,
        dims: (usize, usize),
    },
    Mxfp4 {
        gate_up: (&'a [u8], &'a [u8]),
        down: (&'a [u8], &'a [u8]),
        dims: (usize, usize),
        names: (String, String),
        dtype: WeightDtype,
    },
}

impl<'a> ExpertWeights<'a> {
    fn open<D: Device>(
        ld: &Loader<'a, D>,
        (mxfp4, dtype): (bool, WeightDtype),
        p: &str,
        (h, inter, e): (usize, usize, usize),
    ) -> Result<Self, ModelError> {
        let n = |s: &str| format!("{p}.experts.{s}");
        if !mxfp4 {
            // [E, in, out] as E · in rows of out.
            return Ok(Self::Plain {
                gate_up: ld
                    .w
                    .stacked_matrix(&n("gate_up_proj"), &[e, h, 2 * inter])?,
                down: ld.w.stacked_matrix(&n("down_proj"), &[e, inter, h])?,
                dims: (h, inter),
            });
        }
        let b = mxfp4::BLOCK;
        if !h.is_multiple_of(b) || !inter.is_multiple_of(b) {
            return Err(ModelError::InvalidOptions(format!(
                "MXFP4 experts need hidden_size {h} and intermediate_size {inter} in multiples of {b}"
            )));
        }
        let pair = |s: &str, out: usize, inp: usize| -> Result<(&'a [u8], &'a [u8]), ModelError> {
            Ok((
                ld.w.u8s(&n(&format!("{s}_blocks")), &[e, out, inp / b, b / 2])?,
                ld.w.u8s(&n(&format!("{s}_scales")), &[e, out, inp / b])?,
            ))
        };
        Ok(Self::Mxfp4 {
            gate_up: pair("gate_up_proj", 2 * inter, h)?,
            down: pair("down_proj", h, inter)?,
            dims: (h, inter),
            names: (n("gate_up_proj"), n("down_proj")),
            // Dequantised values are exact in bf16 and f32; f16's range is too small for them.
            dtype: match dtype {
                WeightDtype::F16 => WeightDtype::F32,
                d => d,
            },
        })
    }

    /// Expert `x`'s `[gate | up]` rows `[2I, hidden]` and down `[hidden, I]`.
    fn expert(&self, x: usize) -> Result<(HostMatrix<'static>, HostMatrix<'static>), ModelError> {
        let gate_then_up = |inter: usize| -> Vec<usize> {
            (0..2)
                .flat_map(|half| (half..2 * inter).step_by(2))
                .collect()
        };
        match self {
            Self::Plain {
                gate_up,
                down,
                dims: (h, inter),
            } => {
                let (h, inter) = (*h, *inter);
                Ok((
                    gate_up.transposed(x * h..(x + 1) * h, &gate_then_up(inter)),
                    down.transposed(x * inter..(x + 1) * inter, &(0..h).collect::<Vec<_>>()),
                ))
            }
            Self::Mxfp4 {
                gate_up,
                down,
                dims: (h, inter),
                names,
                dtype,
            } => {
                let (h, inter) = (*h, *inter);
                let one = |(blocks, scales): (&[u8], &[u8]), name: &str, out: usize, inp: usize| {
                    let (bb, sb) = (out * inp / 2, out * inp / mxfp4::BLOCK);
                    let v = mxfp4::dequantize(
                        name,
                        &blocks[x * bb..(x + 1) * bb],
                        &scales[x * sb..(x + 1) * sb],
                        (out, inp),
                    )?;
                    Ok::<_, ModelError>(
                        HostMatrix::from_f32(&v, out, inp)
                            .to_dtype(*dtype)
                            .into_owned(),
                    )
                };
                let gu = one(*gate_up, &names.0, 2 * inter, h)?;
                let ranges: Vec<(usize, usize)> =
                    gate_then_up(inter).iter().map(|&r| (r, 1)).collect();
                Ok((gu.select_rows(&ranges), one(*down, &names.1, h, inter)?))
            }
        }
    }
}

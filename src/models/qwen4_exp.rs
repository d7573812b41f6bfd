//! Qwen4-Exp (text; transformers' `Qwen4ExpForCausalLM`): Qwen3.5-MoE's layers — Gated
//! DeltaNet or gated attention, then a sparse MoE with a gated shared expert — each sublayer
//! between hyper-connections (`{attn,mlp}_hyper_connection`, [`HyperConnection`]) instead of
//! a pre-norm and a residual add; `hyper_connection_mixer` in place of the final norm. The
//! attention layers' QSA indexer (`self_attn.indexer.*`) is not read: requests are capped where
//! it selects every key (`qwen4_exp_config`), so their attention is full attention.

use super::decoder::{Decoder, FinalNorm};
use super::hybrid_config::LayerKind;
use super::layers::{HyperConnection, Layer, Loader, Part, Sublayer};
use super::moe_weights::{self, GATE_BIAS, QWEN_EXPERTS};
use super::qwen3_5::{load_attention, load_gdn};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let missing =
        |what: &str| ModelError::InvalidOptions(format!("Qwen4-Exp spec without its {what}"));
    let hybrid = spec.hybrid.clone().ok_or_else(|| missing("layer kinds"))?;
    let gdn = hybrid
        .gdn
        .clone()
        .ok_or_else(|| missing("Gated DeltaNet geometry"))?;
    let moe = hybrid.moe.clone().ok_or_else(|| missing("experts"))?;
    let vocab = ld.vocab(&spec, "model.embed_tokens")?;
    let mut layers = Vec::with_capacity(spec.num_layers);
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}");
        let index = hybrid.index_in_kind(i);
        let mixer = match hybrid.layers[i] {
            LayerKind::GatedDeltaNet => {
                let prefix = format!("{p}.linear_attn");
                Sublayer::GatedDeltaNet(load_gdn(ld, &prefix, &spec, &gdn, index)?)
            }
            LayerKind::Attention => {
                let prefix = format!("{p}.self_attn");
                let rotary = hybrid.rotary_dim;
                Sublayer::Attention(load_attention(ld, &prefix, &spec, rotary, index)?)
            }
            other => {
                return Err(ModelError::Unsupported {
                    path: ld.w.dir().join("config.json"),
                    what: format!("layer {i} of kind {other:?} in a Qwen4-Exp model"),
                });
            }
        };
        let h = spec.hidden_size;
        let experts =
            moe_weights::load(ld, &format!("{p}.mlp"), h, &moe, (QWEN_EXPERTS, GATE_BIAS))?;
        let hc = |name: &str| load_hyper(ld, &spec, &format!("{p}.{name}"), true);
        layers.push(Layer {
            parts: vec![
                Part::hyper(hc("attn_hyper_connection")?, mixer),
                Part::hyper(hc("mlp_hyper_connection")?, Sublayer::Moe(experts)),
            ],
            scale: 1.0,
        });
    }
    let mixer = load_hyper(ld, &spec, "model.hyper_connection_mixer", false)?;
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Mixer(mixer),
        spec,
        vocab,
        layers,
        ple: None,
    })
}

/// The hyper-connection under `prefix`, with its `block_inject_weight` when `inject`.
fn load_hyper<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    prefix: &str,
    inject: bool,
) -> Result<HyperConnection<D>, ModelError> {
    let hs = spec.hyper.ok_or_else(|| {
        ModelError::InvalidOptions("Qwen4-Exp spec without its hyper-connections".into())
    })?;
    let (streams, hidden, rank) = (hs.streams, spec.hidden_size, hs.rank);
    let wide = streams * hidden;
    let n = |s: &str| format!("{prefix}.{s}");
    let inject = match inject {
        true => Some(ld.linear1(&n("block_inject_weight"), streams, wide, false)?),
        false => None,
    };
    Ok(HyperConnection {
        norm: ld.norm_one_plus(&n("hc_norm"), wide)?,
        down: ld.linear1(&n("input_mix_weight_down"), rank, wide, false)?,
        up: ld.linear1(&n("input_mix_weight_up"), wide, rank, false)?,
        inject,
        streams,
        hidden,
        rank,
        eps: spec.rms_norm_eps,
    })
}

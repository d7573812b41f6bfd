//! Qwen4-Exp (text; transformers' `Qwen4ExpForCausalLM`): Qwen3.5-MoE's layers — Gated
//! DeltaNet or gated attention, then a sparse MoE with a gated shared expert — each sublayer
//! between hyper-connections (`{attn,mlp}_hyper_connection`, [`HyperConnection`]) instead of
//! a pre-norm and a residual add; `hyper_connection_mixer` in place of the final norm; the
//! layers of `ple_layer_ids` first add their hashed n-gram embeddings ([`NgramEmbedding`]); each
//! attention layer's QSA indexer (`self_attn.indexer.*`, [`QsaIndexer`]) picks the keys its
//! tokens past the dense length attend to.

use super::decoder::{Decoder, FinalNorm};
use super::hybrid_config::LayerKind;
use super::layers::{
    Attention, CausalConv, HyperConnection, Layer, Loader, NgramEmbedding, Part, QsaIndexer,
    Sublayer,
};
use super::moe_weights::{self, GATE_BIAS, QWEN_EXPERTS};
use super::ngram_hash::NgramHash;
use super::qwen3_5::{load_attention, load_gdn};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::HostTable;

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
    // Request-slot state: each n-gram layer's conv window, then each Gated DeltaNet's, in
    // layer order (as `Decoder::cache_shape` lists them).
    let mut state_layer = 0;
    let ple = spec.ngram.as_ref().map_or(&[][..], |n| &n.layers[..]);
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}");
        let mut parts = Vec::with_capacity(3);
        if let Some(j) = ple.iter().position(|&l| l == i) {
            let ngram = load_ngram(ld, &spec, (&format!("{p}.ple"), j), state_layer)?;
            state_layer += 1;
            parts.push(Part {
                norm: None,
                sublayer: Sublayer::Ngram(ngram),
                post_norm: None,
                residual_scale: 1.0,
                hyper: None,
            });
        }
        let index = hybrid.index_in_kind(i);
        let mixer = match hybrid.layers[i] {
            LayerKind::GatedDeltaNet => {
                let prefix = format!("{p}.linear_attn");
                state_layer += 1;
                Sublayer::GatedDeltaNet(load_gdn(ld, &prefix, &spec, &gdn, state_layer - 1)?)
            }
            LayerKind::Attention => {
                let prefix = format!("{p}.self_attn");
                let mut attn = load_attention(ld, &prefix, &spec, hybrid.rotary_dim, index)?;
                load_qsa(ld, &format!("{prefix}.indexer"), &spec, &mut attn)?;
                Sublayer::Attention(attn)
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
        parts.push(Part::hyper(hc("attn_hyper_connection")?, mixer));
        parts.push(Part::hyper(
            hc("mlp_hyper_connection")?,
            Sublayer::Moe(experts),
        ));
        layers.push(Layer { parts, scale: 1.0 });
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

/// The QSA indexer under `prefix` (`...self_attn.indexer`) into `attn`, whose tokens past the
/// dense length then attend to the keys it picks.
fn load_qsa<D: Device>(
    ld: &Loader<'_, D>,
    prefix: &str,
    spec: &ModelSpec,
    attn: &mut Attention<D>,
) -> Result<(), ModelError> {
    let q = spec.qsa.ok_or_else(|| {
        ModelError::InvalidOptions("Qwen4-Exp spec without its QSA indexer".into())
    })?;
    let (h, d, qd) = (spec.hidden_size, q.head_dim, q.heads * q.head_dim);
    let proj = ld.matrix(&format!("{prefix}.index_qk_proj.weight"), qd + d, h)?;
    let norm = |s: &str| ld.norm_one_plus(&format!("{prefix}.{s}"), d);
    attn.qsa = Some(QsaIndexer {
        q: ld.dev.linear(proj.select_rows(&[(0, qd)]), None)?,
        k: ld.dev.linear(proj.select_rows(&[(qd, d)]), None)?,
        q_norm: norm("q_layernorm")?,
        k_norm: norm("k_layernorm")?,
        heads: q.heads,
        head_dim: d,
        budget: q.budget,
        ratio: q.ratio,
    });
    attn.variant.sparse = Some(q.dense_len());
    Ok(())
}

/// The n-gram embeddings under `prefix` (`...layers.{i}.ple`), the `index`-th of the model's,
/// their conv window in request-slot state layer `state_layer`.
fn load_ngram<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    (prefix, index): (&str, usize),
    state_layer: usize,
) -> Result<NgramEmbedding<D>, ModelError> {
    let invalid = |what: &str| ModelError::InvalidOptions(format!("Qwen4-Exp n-gram {what}"));
    let (ng, hs) = (spec.ngram.as_ref(), spec.hyper);
    let (ng, hs) = ng
        .zip(hs)
        .ok_or_else(|| invalid("layer without its spec"))?;
    let hash = NgramHash::new(&ng.hash, index).ok_or_else(|| invalid("table past u32 ids"))?;
    let (streams, hidden, embed) = (hs.streams, spec.hidden_size, ng.embed_dim);
    let wide = streams * hidden;
    let n = |s: &str| format!("{prefix}.{s}");
    let shape = (hash.rows, embed / ng.heads(), ng.parts);
    let table = ngram_table(ld, &n("ple_embedding.ngram_embedding"), shape)?;
    // Dilation `ngram_size`: tap j of the `[wide, 1, k]` weight goes to tap j · d of an
    // undilated conv of (k - 1) · d + 1 taps, zeros between.
    let (k, d) = (ng.conv_kernel, ng.hash.ngram_size);
    let taps = (k - 1) * d + 1;
    let w = ld.f32s(&n("conv1d.weight"), &[wide, 1, k])?;
    let mut spread = vec![0.0f32; wide * taps];
    for (c, row) in w.chunks_exact(k).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            spread[c * taps + j * d] = v;
        }
    }
    Ok(NgramEmbedding {
        hash,
        table,
        key_proj: ld.linear1(&n("key_proj"), wide, embed, false)?,
        value_proj: ld.linear1(&n("value_proj"), hidden, embed, false)?,
        norm_key: ld.norm_one_plus(&n("norm_key"), wide)?,
        norm_query: ld.norm_one_plus(&n("norm_query"), wide)?,
        norm_conv: ld.norm_one_plus(&n("norm_conv"), wide)?,
        conv: CausalConv {
            weight: ld.dev.vector(&spread)?,
            bias: None,
            kernel: taps,
            state_layer,
            silu: true,
        },
        embed_dim: embed,
        streams,
        hidden,
        eps: spec.rms_norm_eps,
    })
}

/// The n-gram table `{name}.weight` `[rows, cols]`, or as a release stores it, in its
/// `split_ngram_parts` pieces `{name}.shard_0.weight`, `{name}.shard_1.weight`, … (rows one
/// after another, as transformers concatenates them).
fn ngram_table<D: Device>(
    ld: &Loader<'_, D>,
    name: &str,
    (rows, cols, pieces): (usize, usize, usize),
) -> Result<D::Table, ModelError> {
    if ld.w.contains(&format!("{name}.weight")) {
        return ld.table(name, rows, cols);
    }
    let mut parts = Vec::new();
    let mut seen = 0;
    while ld
        .w
        .contains(&format!("{name}.shard_{}.weight", parts.len()))
    {
        let shard = format!("{name}.shard_{}.weight", parts.len());
        let r = ld.w.shape_of(&shard)?.first().copied().unwrap_or(0);
        parts.push(ld.w.table(&shard, r, cols)?);
        seen += r;
    }
    if seen != rows || parts.len() != pieces {
        return Err(ModelError::TensorShape {
            name: format!("{name}.shard_*.weight"),
            expected: vec![rows, cols],
            found: vec![seen, cols],
        });
    }
    let table = HostTable::concat(parts).map_err(ModelError::InvalidOptions)?;
    Ok(ld.dev.table(table)?)
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

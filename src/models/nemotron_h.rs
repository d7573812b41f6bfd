//! Nemotron-H: a stack of blocks `x += mixer(norm(x))`, each mixer a Mamba-2 layer, an
//! attention layer (no RoPE, no norms, no bias), an MLP `down(relu(up(x))²)` or (Nemotron 3)
//! a MoE block ([`super::nemotron_moe`]). Every block
//! counts as a layer (transformers' `hidden_states` has one entry per block). On-disk names:
//! `backbone.embeddings`, `backbone.layers.{i}.{norm,mixer}`, `backbone.norm_f`, `lm_head`.

use super::decoder::{Decoder, FinalNorm};
use super::hybrid_config::{LayerKind, MambaNorm, MambaSpec};
use super::layers::mlp::Activation;
use super::layers::{
    Attention, CausalConv, Layer, Loader, Mamba2, OutNorm, Part, SoftmaxVariant, Sublayer, neg_exp,
};
use super::{ModelError, ModelSpec};
use crate::kernels::Device;
use crate::kernels::device::MambaDims;
use crate::kernels::rope::Rope;

pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    let missing = || {
        ModelError::InvalidOptions(format!(
            "{} spec without its Mamba-2 geometry",
            spec.architecture.hf_name()
        ))
    };
    let hybrid = spec.hybrid.clone().ok_or_else(missing)?;
    let mamba = hybrid.mamba.clone().ok_or_else(missing)?;
    let h = spec.hidden_size;
    let vocab = ld.vocab(&spec, "backbone.embeddings")?;
    let (mut attn, mut rec) = (0, 0);
    let mut layers = Vec::with_capacity(hybrid.layers.len());
    for (i, &kind) in hybrid.layers.iter().enumerate() {
        let px = format!("backbone.layers.{i}.mixer");
        let sublayer = match kind {
            LayerKind::Mamba2 => {
                rec += 1;
                Sublayer::Mamba2(load_mamba(ld, &px, &spec, &mamba, rec - 1)?)
            }
            LayerKind::Attention => {
                attn += 1;
                Sublayer::Attention(load_attention(
                    ld,
                    &px,
                    &spec,
                    attn - 1,
                    SoftmaxVariant::causal(),
                )?)
            }
            LayerKind::Mlp => {
                Sublayer::Mlp(super::dense::load_mlp(ld, &spec, &px, Activation::Relu2)?)
            }
            LayerKind::Moe => {
                let m = hybrid.nemotron_moe.as_ref().ok_or_else(missing)?;
                Sublayer::NemotronMoe(super::nemotron_moe::load(ld, &px, &spec, m)?)
            }
            LayerKind::GatedDeltaNet
            | LayerKind::KimiDelta
            | LayerKind::Mamba1
            | LayerKind::MambaAttention
            | LayerKind::ShortConv => {
                return Err(ModelError::Unsupported {
                    path: ld.w.dir().join("config.json"),
                    what: format!("block {i}: {kind:?} in a Nemotron-H model"),
                });
            }
        };
        let norm = ld.vector(&format!("backbone.layers.{i}.norm.weight"), h)?;
        layers.push(Layer {
            parts: vec![Part::new(norm, sublayer)],
            scale: 1.0,
        });
    }
    Ok(Decoder {
        embed_scale: 1.0,
        final_norm: FinalNorm::Norm(ld.vector("backbone.norm_f.weight", h)?),
        spec,
        vocab,
        layers,
        ple: None,
    })
}

/// A hybrid's `kv_layer`-th attention under `px` (`{px}.{q,k,v,o}_proj`): no q/k norms, the
/// spec's biases, RoPE only where the spec rotates (`rotary_dim` > 0; Nemotron-H never does),
/// the softmax of `variant`.
pub(super) fn load_attention<D: Device>(
    ld: &Loader<'_, D>,
    px: &str,
    spec: &ModelSpec,
    kv_layer: usize,
    variant: SoftmaxVariant<D::Vector>,
) -> Result<Attention<D>, ModelError> {
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let n = |s: &str| format!("{px}.{s}");
    let parts = [(n("q_proj"), qd), (n("k_proj"), kvd), (n("v_proj"), kvd)];
    let qkv = ld.linear(&parts, h, spec.qkv_bias)?;
    let o = ld.linear1(&n("o_proj"), h, qd, spec.o_bias)?;
    attention_with(ld, spec, kv_layer, variant, (qkv, o))
}

/// A hybrid's `kv_layer`-th attention around the given fused `qkv` and `o` projections, as
/// [`load_attention`] describes it.
pub(super) fn attention_with<D: Device>(
    ld: &Loader<'_, D>,
    spec: &ModelSpec,
    kv_layer: usize,
    variant: SoftmaxVariant<D::Vector>,
    (qkv, o): (D::Linear, D::Linear),
) -> Result<Attention<D>, ModelError> {
    let rope = match spec.hybrid.as_ref().map_or(0, |h| h.rotary_dim) {
        0 => None,
        rot => {
            let table = Rope::new(rot, spec.rope_theta, spec.rope_scaling);
            Some((ld.dev.rope_table(&table)?, rot))
        }
    };
    Ok(Attention {
        rope,
        variant,
        ..Attention::plain((qkv, o), spec, kv_layer)
    })
}

/// The Mamba-2 mixer under `px` (`{px}.{in_proj, conv1d, A_log, D, dt_bias, norm, out_proj}`),
/// its projections with `m.proj_bias`.
pub(super) fn load_mamba<D: Device>(
    ld: &Loader<'_, D>,
    px: &str,
    spec: &ModelSpec,
    m: &MambaSpec,
    state_layer: usize,
) -> Result<Mamba2<D>, ModelError> {
    let (h, n) = (spec.hidden_size, |s: &str| format!("{px}.{s}"));
    let in_rows = m.intermediate() + m.conv_dim() + m.num_heads;
    let in_proj = ld.linear1(&n("in_proj"), in_rows, h, m.proj_bias)?;
    let out_proj = ld.linear1(&n("out_proj"), h, m.intermediate(), m.proj_bias)?;
    mamba_with(ld, px, spec, m, state_layer, (in_proj, out_proj))
}

/// The Mamba-2 mixer under `px` around the given `in_proj` and `out_proj`.
pub(super) fn mamba_with<D: Device>(
    ld: &Loader<'_, D>,
    px: &str,
    spec: &ModelSpec,
    m: &MambaSpec,
    state_layer: usize,
    (in_proj, out_proj): (D::Linear, D::Linear),
) -> Result<Mamba2<D>, ModelError> {
    let (inner, conv_dim, nh, k) = (m.intermediate(), m.conv_dim(), m.num_heads, m.conv_kernel);
    let n = |s: &str| format!("{px}.{s}");
    let bias = match m.conv_bias {
        true => Some(ld.vector(&n("conv1d.bias"), conv_dim)?),
        false => None,
    };
    let norm = |before_gate| -> Result<_, ModelError> {
        let w = ld.vector(&n("norm.weight"), inner)?;
        Ok(Some(OutNorm { w, before_gate }))
    };
    let a_log = ld.f32s(&n("A_log"), &[nh])?;
    Ok(Mamba2 {
        in_proj,
        conv: CausalConv {
            weight: ld
                .dev
                .vector(&ld.f32s(&n("conv1d.weight"), &[conv_dim, 1, k])?)?,
            bias,
            kernel: k,
            state_layer,
            silu: true,
        },
        neg_a: ld.dev.vector(&neg_exp(&a_log))?,
        d: ld.vector(&n("D"), nh)?,
        dt_bias: ld.vector(&n("dt_bias"), nh)?,
        norm: match m.norm {
            MambaNorm::AfterGate => norm(false)?,
            MambaNorm::BeforeGate => norm(true)?,
            MambaNorm::None => None,
        },
        out_proj,
        dims: MambaDims {
            heads: nh,
            head_dim: m.head_dim,
            d_state: m.state_size,
            groups: m.n_groups,
            dt_min: m.time_step_min as f32,
        },
        eps: spec.rms_norm_eps,
    })
}

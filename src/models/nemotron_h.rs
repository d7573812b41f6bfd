//! Nemotron-H on the CPU kernels: a stack of blocks `x += mixer(norm(x))`, each mixer a
//! Mamba-2 layer, an attention layer (no RoPE, no bias) or an MLP `down(relu(up(x))²)`.
//! Every block counts as a layer (transformers' `hidden_states` has one entry per block).
//!
//! Mamba-2: `in_proj` -> `[z (inner) | xBC (conv_dim) | dt (heads)]`; causal conv + SiLU over
//! xBC with the request slot's conv state; the selective scan token by token with `dt`
//! clamped to `time_step_min` (transformers' prefill path; its single-token decode path does
//! not clamp, hsx uses one rule for every token); `y·silu(z)` then RMSNorm per group, then
//! `out_proj`. On-disk names: `backbone.embeddings`, `backbone.layers.{i}.{norm,mixer}`,
//! `backbone.norm_f`, `lm_head`.

use super::hybrid_attn::{AttnScratch, HybridAttention, kind_indices, load_linear};
use super::hybrid_config::{LayerKind, MambaSpec};
use super::{ModelError, ModelSpec, Weights};
use crate::kernels::cpu::kv_cache::{BatchPlan, KvCache};
use crate::kernels::cpu::matmul::Linear;
use crate::kernels::cpu::ops;
use crate::kernels::cpu::recurrent::{
    MambaParams, SeqState, StateCache, causal_conv_silu, gate_then_grouped_rms_norm, mamba2_scan,
};

struct MambaLayer {
    in_proj: Linear,
    conv_w: Vec<f32>,
    conv_b: Option<Vec<f32>>,
    neg_a: Vec<f32>,
    d: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    out_proj: Linear,
    state_index: usize,
}

struct Mlp {
    up: Linear,
    down: Linear,
}

enum Mixer {
    Mamba(MambaLayer),
    Attn(HybridAttention),
    Mlp(Mlp),
}

struct Block {
    norm: Vec<f32>,
    mixer: Mixer,
}

/// Weights of a Nemotron-H model, widened to f32.
pub struct NemotronHModel {
    spec: ModelSpec,
    mamba: MambaSpec,
    embed: Vec<f32>,
    blocks: Vec<Block>,
    final_norm: Vec<f32>,
    lm_head: Option<Vec<f32>>,
    num_attn: usize,
    num_mamba: usize,
}

#[derive(Default)]
struct Scratch {
    normed: Vec<f32>,
    proj: Vec<f32>,
    z: Vec<f32>,
    xbc: Vec<f32>,
    dt: Vec<f32>,
    conv: Vec<f32>,
    y: Vec<f32>,
    act: Vec<f32>,
    out: Vec<f32>,
    attn: AttnScratch,
}

impl NemotronHModel {
    pub fn load(weights: &Weights, spec: ModelSpec) -> Result<Self, ModelError> {
        let hybrid = spec.hybrid.clone().expect("hybrid spec");
        let mamba = hybrid
            .mamba
            .clone()
            .expect("Nemotron-H has Mamba-2 geometry");
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        let embed = weights.tensor("backbone.embeddings.weight", &[v, h])?;
        let (idx, num_attn, num_mamba) = kind_indices(&hybrid.layers);
        let blocks = hybrid
            .layers
            .iter()
            .enumerate()
            .map(|(i, &kind)| load_block(weights, &spec, &mamba, kind, i, idx[i]))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = weights.tensor("backbone.norm_f.weight", &[h])?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(weights.tensor("lm_head.weight", &[v, h])?)
        };
        Ok(Self {
            spec,
            mamba,
            embed,
            blocks,
            final_norm,
            lm_head,
            num_attn,
            num_mamba,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn num_attention_layers(&self) -> usize {
        self.num_attn
    }

    pub fn kv_dim(&self) -> usize {
        self.spec.num_kv_heads * self.spec.head_dim
    }

    /// `(conv floats, SSM floats)` per slot of each Mamba-2 layer.
    pub fn state_shapes(&self) -> Vec<(usize, usize)> {
        let m = &self.mamba;
        vec![
            (
                (m.conv_kernel - 1) * m.conv_dim(),
                m.num_heads * m.head_dim * m.state_size
            );
            self.num_mamba
        ]
    }

    pub fn final_norm(&self, x: &[f32]) -> Vec<f32> {
        super::head::final_norm(x, &self.final_norm, self.spec.rms_norm_eps)
    }

    pub fn greedy(&self, rows: &[f32], threads: usize) -> Vec<u32> {
        let head = self.lm_head.as_deref();
        super::head::greedy(
            &self.spec,
            rows,
            &self.final_norm,
            head,
            &self.embed,
            threads,
        )
    }

    /// Runs every block; `capture(id, x)` sees the residual stream for ids 0..=L. Returns the
    /// last block's (pre-norm) output. Fresh chunks' state slots must already be zeroed.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        tokens: &[u32],
        plan: &BatchPlan<'_>,
        seqs: &[SeqState],
        cache: &mut KvCache,
        states: &mut StateCache,
        threads: usize,
        capture: &mut dyn FnMut(usize, &[f32]),
    ) -> Vec<f32> {
        let h = self.spec.hidden_size;
        let t = tokens.len();
        let mut x = super::head::embed_tokens(&self.embed, h, tokens);
        capture(0, &x);
        let mut s = Scratch::default();
        for (i, block) in self.blocks.iter().enumerate() {
            ops::rms_norm(&x, &block.norm, self.spec.rms_norm_eps, &mut s.normed);
            match &block.mixer {
                Mixer::Mamba(m) => self.mamba_forward(m, seqs, states, threads, &mut s),
                Mixer::Attn(a) => {
                    a.forward(&s.normed, plan, cache, threads, &mut s.attn, &mut s.out)
                }
                Mixer::Mlp(m) => {
                    m.up.forward(&s.normed, t, &mut s.act, threads);
                    for v in &mut s.act {
                        let r = v.max(0.0);
                        *v = r * r;
                    }
                    m.down.forward(&s.act, t, &mut s.out, threads);
                }
            }
            ops::add_inplace(&mut x, &s.out);
            capture(i + 1, &x);
        }
        x
    }

    fn mamba_forward(
        &self,
        m: &MambaLayer,
        seqs: &[SeqState],
        states: &mut StateCache,
        threads: usize,
        s: &mut Scratch,
    ) {
        let spec = &self.mamba;
        let t = s.normed.len() / self.spec.hidden_size;
        let (inner, conv_dim, nh) = (spec.intermediate(), spec.conv_dim(), spec.num_heads);
        m.in_proj.forward(&s.normed, t, &mut s.proj, threads);
        s.z.clear();
        s.xbc.clear();
        s.dt.clear();
        for row in s.proj.chunks_exact(inner + conv_dim + nh) {
            s.z.extend_from_slice(&row[..inner]);
            s.xbc.extend_from_slice(&row[inner..inner + conv_dim]);
            s.dt.extend_from_slice(&row[inner + conv_dim..]);
        }
        let st = states.layer_mut(m.state_index);
        causal_conv_silu(
            &s.xbc,
            conv_dim,
            &m.conv_w,
            m.conv_b.as_deref(),
            spec.conv_kernel,
            seqs,
            &mut st.conv,
            &mut s.conv,
        );
        let params = MambaParams {
            heads: nh,
            head_dim: spec.head_dim,
            d_state: spec.state_size,
            groups: spec.n_groups,
            neg_a: &m.neg_a,
            d: &m.d,
            dt_bias: &m.dt_bias,
            dt_min: spec.time_step_min as f32,
        };
        mamba2_scan(&s.conv, &s.dt, &params, seqs, &mut st.ssm, &mut s.y);
        gate_then_grouped_rms_norm(
            &mut s.y,
            &s.z,
            &m.norm,
            inner / spec.n_groups,
            self.spec.rms_norm_eps,
        );
        m.out_proj.forward(&s.y, t, &mut s.out, threads);
    }
}

fn load_block(
    w: &Weights,
    spec: &ModelSpec,
    m: &MambaSpec,
    kind: LayerKind,
    i: usize,
    kind_index: usize,
) -> Result<Block, ModelError> {
    let p = format!("backbone.layers.{i}");
    let px = format!("{p}.mixer");
    let h = spec.hidden_size;
    let mixer = match kind {
        LayerKind::Mamba2 => {
            let (inner, conv_dim, nh, k) =
                (m.intermediate(), m.conv_dim(), m.num_heads, m.conv_kernel);
            let a_log = w.tensor(&format!("{px}.A_log"), &[nh])?;
            Mixer::Mamba(MambaLayer {
                in_proj: load_linear(
                    w,
                    &format!("{px}.in_proj"),
                    inner + conv_dim + nh,
                    h,
                    m.proj_bias,
                )?,
                conv_w: w.tensor(&format!("{px}.conv1d.weight"), &[conv_dim, 1, k])?,
                conv_b: if m.conv_bias {
                    Some(w.tensor(&format!("{px}.conv1d.bias"), &[conv_dim])?)
                } else {
                    None
                },
                neg_a: a_log.iter().map(|&v| -v.exp()).collect(),
                d: w.tensor(&format!("{px}.D"), &[nh])?,
                dt_bias: w.tensor(&format!("{px}.dt_bias"), &[nh])?,
                norm: w.tensor(&format!("{px}.norm.weight"), &[inner])?,
                out_proj: load_linear(w, &format!("{px}.out_proj"), h, inner, m.proj_bias)?,
                state_index: kind_index,
            })
        }
        LayerKind::Attention => Mixer::Attn(HybridAttention::load_plain(w, &px, spec, kind_index)?),
        LayerKind::Mlp => {
            let inter = spec.intermediate_size;
            Mixer::Mlp(Mlp {
                up: load_linear(w, &format!("{px}.up_proj"), inter, h, spec.mlp_bias)?,
                down: load_linear(w, &format!("{px}.down_proj"), h, inter, spec.mlp_bias)?,
            })
        }
        LayerKind::GatedDeltaNet => {
            return Err(ModelError::Unsupported {
                path: w.dir().join("config.json"),
                what: format!("block {i}: Gated DeltaNet in a Nemotron-H model"),
            });
        }
    };
    Ok(Block {
        norm: w.tensor(&format!("{p}.norm.weight"), &[h])?,
        mixer,
    })
}

//! Pieces shared by the hybrid families: the full-attention layer (Qwen3.5 / Qwen3-Next gated
//! attention with zero-centred q/k norms and partial rotary; Nemotron-H plain attention without
//! RoPE), linear loading and the per-layer state/KV indices.

use super::{ModelError, ModelSpec, Weights};
use crate::kernels::cpu::attention::{AttnShape, attention};
use crate::kernels::cpu::kv_cache::{BatchPlan, KvCache};
use crate::kernels::cpu::matmul::Linear;
use crate::kernels::cpu::ops::{self, Rope};
use crate::kernels::cpu::recurrent::sigmoid;

/// Loads `{name}.weight` `[out, inp]` (and `{name}.bias` when `bias`).
pub(super) fn load_linear(
    w: &Weights,
    name: &str,
    out: usize,
    inp: usize,
    bias: bool,
) -> Result<Linear, ModelError> {
    let weight = w.tensor(&format!("{name}.weight"), &[out, inp])?;
    let b = if bias {
        Some(w.tensor(&format!("{name}.bias"), &[out])?)
    } else {
        None
    };
    Ok(Linear {
        w: weight,
        b,
        out,
        inp,
    })
}

/// `1 + w` of a zero-centred RMSNorm (computed once in f32, as transformers does per call).
pub(crate) fn one_plus(mut w: Vec<f32>) -> Vec<f32> {
    for v in &mut w {
        *v += 1.0;
    }
    w
}

/// Full attention of a hybrid model.
pub(super) struct HybridAttention {
    /// `[q_proj | k_proj | v_proj]` stacked; for the gated form q_proj rows are per head
    /// `[q(hd) | gate(hd)]`.
    qkv: Linear,
    /// Zero-centred q/k norms, stored as `1 + w`.
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Linear,
    gated: bool,
    rope: Option<Rope>,
    rotary_dim: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
    /// Index of this layer in the KV cache (attention layers only).
    kv_index: usize,
}

/// Scratch of one attention call.
#[derive(Default)]
pub(super) struct AttnScratch {
    qkv: Vec<f32>,
    q: Vec<f32>,
    gate: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
}

impl HybridAttention {
    /// Qwen3.5 / Qwen3-Next gated attention (`prefix` = `...layers.{i}.self_attn`).
    pub(super) fn load_gated(
        w: &Weights,
        prefix: &str,
        spec: &ModelSpec,
        rotary_dim: usize,
        kv_index: usize,
    ) -> Result<Self, ModelError> {
        let (h, hd) = (spec.hidden_size, spec.head_dim);
        let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
        let n = |s: &str| format!("{prefix}.{s}");
        let bias = spec.qkv_bias;
        Ok(Self {
            qkv: Linear::concat(vec![
                load_linear(w, &n("q_proj"), 2 * qd, h, bias)?,
                load_linear(w, &n("k_proj"), kvd, h, bias)?,
                load_linear(w, &n("v_proj"), kvd, h, bias)?,
            ]),
            q_norm: Some(one_plus(w.tensor(&n("q_norm.weight"), &[hd])?)),
            k_norm: Some(one_plus(w.tensor(&n("k_norm.weight"), &[hd])?)),
            o: load_linear(w, &n("o_proj"), h, qd, spec.o_bias)?,
            gated: true,
            rope: Some(Rope::new(rotary_dim, spec.rope_theta, spec.rope_scaling)),
            rotary_dim,
            heads: spec.num_heads,
            kv_heads: spec.num_kv_heads,
            head_dim: hd,
            eps: spec.rms_norm_eps,
            kv_index,
        })
    }

    /// Nemotron-H attention: no RoPE, no norms, no bias (`prefix` = `...layers.{i}.mixer`).
    pub(super) fn load_plain(
        w: &Weights,
        prefix: &str,
        spec: &ModelSpec,
        kv_index: usize,
    ) -> Result<Self, ModelError> {
        let (h, hd) = (spec.hidden_size, spec.head_dim);
        let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
        let n = |s: &str| format!("{prefix}.{s}");
        Ok(Self {
            qkv: Linear::concat(vec![
                load_linear(w, &n("q_proj"), qd, h, false)?,
                load_linear(w, &n("k_proj"), kvd, h, false)?,
                load_linear(w, &n("v_proj"), kvd, h, false)?,
            ]),
            q_norm: None,
            k_norm: None,
            o: load_linear(w, &n("o_proj"), h, qd, false)?,
            gated: false,
            rope: None,
            rotary_dim: 0,
            heads: spec.num_heads,
            kv_heads: spec.num_kv_heads,
            head_dim: hd,
            eps: spec.rms_norm_eps,
            kv_index,
        })
    }

    /// `out[T, hidden]` = attention block output (before the residual add) for `normed` rows.
    pub(super) fn forward(
        &self,
        normed: &[f32],
        plan: &BatchPlan<'_>,
        cache: &mut KvCache,
        threads: usize,
        s: &mut AttnScratch,
        out: &mut Vec<f32>,
    ) {
        let t = plan.num_tokens();
        let hd = self.head_dim;
        let (qd, kvd) = (self.heads * hd, self.kv_heads * hd);
        self.qkv.forward(normed, t, &mut s.qkv, threads);
        let q_width = if self.gated { 2 * qd } else { qd };
        s.q.clear();
        s.gate.clear();
        s.k.clear();
        s.v.clear();
        for row in s.qkv.chunks_exact(q_width + 2 * kvd) {
            let (qpart, kv) = row.split_at(q_width);
            if self.gated {
                for head in qpart.chunks_exact(2 * hd) {
                    s.q.extend_from_slice(&head[..hd]);
                    s.gate.extend_from_slice(&head[hd..]);
                }
            } else {
                s.q.extend_from_slice(qpart);
            }
            s.k.extend_from_slice(&kv[..kvd]);
            s.v.extend_from_slice(&kv[kvd..]);
        }
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            ops::rms_norm_inplace(&mut s.q, qn, self.eps);
            ops::rms_norm_inplace(&mut s.k, kn, self.eps);
        }
        if let Some(rope) = &self.rope {
            partial_rope(rope, &mut s.q, &plan.positions, hd, self.rotary_dim);
            partial_rope(rope, &mut s.k, &plan.positions, hd, self.rotary_dim);
        }
        cache.write(self.kv_index, &plan.slots, &s.k, &s.v);
        let (kc, vc) = cache.layer(self.kv_index);
        let shape = AttnShape {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: hd,
            scale: (hd as f64).powf(-0.5) as f32,
        };
        attention(&s.q, kc, vc, plan, shape, &mut s.attn);
        if self.gated {
            for (a, &g) in s.attn.iter_mut().zip(&s.gate) {
                *a *= sigmoid(g);
            }
        }
        self.o.forward(&s.attn, t, out, threads);
    }
}

/// Rotate-half RoPE on the first `rotary_dim` dims of every `head_dim`-wide head of each row
/// (transformers `apply_rotary_pos_emb` with partial rotary); the rest pass through.
fn partial_rope(
    rope: &Rope,
    x: &mut [f32],
    positions: &[usize],
    head_dim: usize,
    rotary_dim: usize,
) {
    let half = rotary_dim / 2;
    let row = x.len() / positions.len().max(1);
    let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
    for (xr, &pos) in x.chunks_exact_mut(row).zip(positions) {
        rope.cos_sin(pos, &mut cos, &mut sin);
        for head in xr.chunks_exact_mut(head_dim) {
            let (a, b) = head[..rotary_dim].split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] + (-x2) * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

/// Index of each layer among the layers of its kind (KV cache index for attention layers,
/// state-cache index for recurrent ones).
pub(crate) fn kind_indices(kinds: &[super::LayerKind]) -> (Vec<usize>, usize, usize) {
    let (mut attn, mut rec) = (0, 0);
    let idx = kinds
        .iter()
        .map(|k| match k {
            super::LayerKind::Attention => {
                attn += 1;
                attn - 1
            }
            k if k.is_recurrent() => {
                rec += 1;
                rec - 1
            }
            _ => 0,
        })
        .collect();
    (idx, attn, rec)
}

#[cfg(test)]
mod tests {
    use super::super::LayerKind::*;
    use super::*;

    #[test]
    fn kind_indices_count_per_kind() {
        let (idx, attn, rec) = kind_indices(&[Mamba2, Mlp, Attention, Mlp, Mamba2, Attention]);
        assert_eq!(idx, vec![0, 0, 0, 0, 1, 1]);
        assert_eq!((attn, rec), (2, 2));
    }
}

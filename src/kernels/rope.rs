//! The RoPE frequency table (host side, every device): `inv_freq` per rotary dim pair, with
//! linear, llama3, YaRN or LongRoPE scaling, and the f32 cos/sin transformers computes from it,
//! times a scale: YaRN's and LongRoPE's attention factor, which transformers multiplies into
//! cos and sin — so only the rotated dims carry it (a partial rotary factor passes the others
//! through unscaled, as do MLA's non-rotated dims).

use super::dtype::RopeScaling;

/// Rotary embedding, rotate-half convention (transformers `apply_rotary_pos_emb`).
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// cos and sin are multiplied by it (f32, after they are computed; 1: no scaling).
    scale: f32,
}

impl Rope {
    /// cos and sin times YaRN's attention factor (1 for the other scalings).
    pub fn new(head_dim: usize, theta: f64, scaling: RopeScaling) -> Self {
        let mut inv_freq = default_inv_freq(head_dim, theta);
        if let RopeScaling::Yarn { .. } = scaling {
            inv_freq = yarn_inv_freq(head_dim, theta, scaling);
        }
        if let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = scaling
        {
            llama3_scale(
                &mut inv_freq,
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                original_max_position_embeddings as f32,
            );
        }
        if let RopeScaling::Linear { factor } = scaling {
            // transformers `_compute_linear_scaling_rope_parameters`: `inv_freq /= factor` (f32).
            let factor = factor as f32;
            inv_freq.iter_mut().for_each(|f| *f /= factor);
        }
        let scale = match scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor as f32,
            _ => 1.0,
        };
        Self { inv_freq, scale }
    }

    /// Phi-3's LongRoPE over `rot` rotated dims (transformers `_compute_longrope_parameters`):
    /// each default frequency divided by its factor, `1 / (factor_i · theta^(2i / rot))` in f32,
    /// cos and sin times `scale` (its attention factor).
    pub fn with_factors(rot: usize, theta: f64, factors: &[f64], scale: f64) -> Self {
        let base = theta as f32;
        let inv_freq = factors
            .iter()
            .take(rot / 2)
            .enumerate()
            .map(|(i, &f)| 1.0f32 / (f as f32 * base.powf((2 * i) as f32 / rot as f32)))
            .collect();
        Self {
            inv_freq,
            scale: scale as f32,
        }
    }

    /// Gemma 4's proportional RoPE over a whole head (transformers
    /// `_compute_proportional_rope_parameters`): the first `⌊partial · head_dim / 2⌋` pairs
    /// rotate at the default frequencies of `head_dim`, the other pairs at frequency 0 (cos 1,
    /// sin 0: they pass through unchanged, bit for bit); every frequency divided by `factor`.
    pub fn proportional(head_dim: usize, theta: f64, partial: f64, factor: f64) -> Self {
        let angles = ((partial * head_dim as f64) / 2.0).floor() as usize;
        let mut inv_freq = default_inv_freq(head_dim, theta);
        inv_freq.iter_mut().skip(angles).for_each(|f| *f = 0.0);
        let factor = factor as f32;
        inv_freq.iter_mut().for_each(|f| *f /= factor);
        Self {
            inv_freq,
            scale: 1.0,
        }
    }

    /// A table over `dims` that rotates nothing (every frequency 0: each value passes through
    /// bit for bit): Kimi Linear's latent attention keeps its "rotated" key part unrotated.
    pub fn identity(dims: usize) -> Self {
        Self::proportional(dims, 1.0, 0.0, 1.0)
    }

    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// What cos and sin are multiplied by.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// `(cos, sin)` for one position, each `head_dim / 2` long.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            // transformers: freqs = inv_freq (f32) * position (f32), cos/sin in f32.
            let angle = (f * pos as f32) as f64;
            *c = angle.cos() as f32 * self.scale;
            *s = angle.sin() as f32 * self.scale;
        }
    }
}

/// `x * cos + rotate_half(x) * sin` for one head.
#[inline]
pub fn rotate_half(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (a, b) = head.split_at_mut(half);
    for i in 0..half {
        let (x1, x2) = (a[i], b[i]);
        a[i] = x1 * cos[i] + (-x2) * sin[i];
        b[i] = x2 * cos[i] + x1 * sin[i];
    }
}

/// `1 / theta^(2i / d)` in f32, as transformers `_compute_default_rope_parameters`.
fn default_inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    let base = theta as f32;
    (0..head_dim / 2)
        .map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}

/// transformers `_compute_yarn_parameters` (f64 where Python computes in floats, f32 where
/// torch does).
fn yarn_inv_freq(dim: usize, theta: f64, scaling: RopeScaling) -> Vec<f32> {
    let RopeScaling::Yarn {
        factor,
        beta_fast,
        beta_slow,
        original_max_position_embeddings: ctx,
        truncate,
        ..
    } = scaling
    else {
        return default_inv_freq(dim, theta);
    };
    let d = dim as f64;
    let correction_dim =
        |rot: f64| (d * (ctx / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln());
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    let (low, high) = (low as f32, high as f32);
    let base = theta as f32;
    let factor = factor as f32;
    (0..dim / 2)
        .map(|i| {
            let pos_freq = base.powf((2 * i) as f32 / dim as f32);
            let extrapolation = 1.0 / pos_freq;
            let interpolation = 1.0 / (factor * pos_freq);
            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolation * (1.0 - keep) + extrapolation * keep
        })
        .collect()
}

/// transformers `_compute_llama3_parameters`, step by step in f32 (torch's
/// `scalar / tensor` is `reciprocal(tensor) * scalar`).
fn llama3_scale(inv: &mut [f32], factor: f32, low: f32, high: f32, old_ctx: f32) {
    let low_freq_wavelen = old_ctx / low;
    let high_freq_wavelen = old_ctx / high;
    let two_pi = std::f64::consts::PI as f32 * 2.0;
    for f in inv.iter_mut() {
        let wavelen = (1.0 / *f) * two_pi;
        let llama = if wavelen > low_freq_wavelen {
            *f / factor
        } else {
            *f
        };
        let smooth = ((1.0 / wavelen) * old_ctx - low) / (high - low);
        let smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
        // ~(wavelen < high) * ~(wavelen > low); wavelen is never NaN here.
        let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
        *f = if medium { smoothed } else { llama };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 4-31B's full layers (head_dim 512, partial 0.25, theta 1e6): transformers 5.24's
    /// `_compute_proportional_rope_parameters` gives 256 frequencies, 64 rotating (values
    /// printed from it), the rest 0 — whose pairs pass through exactly.
    #[test]
    fn proportional_rotates_a_share_of_the_pairs() {
        let r = Rope::proportional(512, 1e6, 0.25, 1.0);
        let f = r.inv_freq();
        assert_eq!(f.len(), 256);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[1] as f64, f64::from_bits(0x3FEE519F00000000));
        assert_eq!(f[2] as f64, f64::from_bits(0x3FECB9DA60000000));
        assert_eq!(f[63] as f64, f64::from_bits(0x3FA116B100000000));
        assert!(f[64..].iter().all(|&v| v == 0.0));
        let (mut cos, mut sin) = (vec![0.0; 256], vec![0.0; 256]);
        r.cos_sin(4321, &mut cos, &mut sin);
        assert!(cos[64..].iter().all(|&c| c == 1.0) && sin[64..].iter().all(|&s| s == 0.0));
        assert_ne!(sin[63], 0.0);
        let halved = Rope::proportional(512, 1e6, 0.25, 2.0);
        assert_eq!(halved.inv_freq()[1], f[1] / 2.0);
    }

    #[test]
    fn llama3_has_three_bands() {
        let plain = Rope::new(16, 10000.0, RopeScaling::None);
        let scaled = Rope::new(
            16,
            10000.0,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64.0,
            },
        );
        let ratios: Vec<f32> = scaled
            .inv_freq()
            .iter()
            .zip(plain.inv_freq())
            .map(|(a, b)| a / b)
            .collect();
        assert_eq!(ratios[0], 1.0);
        assert!(ratios[1] < 1.0 && ratios[1] > 0.125);
        assert!((ratios[7] - 0.125).abs() < 1e-6);
    }

    /// Linear scaling divides every frequency by the factor, in f32 as transformers does.
    #[test]
    fn linear_divides_every_frequency() {
        let plain = Rope::new(16, 10000.0, RopeScaling::None);
        let linear = Rope::new(16, 10000.0, RopeScaling::Linear { factor: 8.0 });
        for (l, p) in linear.inv_freq().iter().zip(plain.inv_freq()) {
            assert_eq!(*l, p / 8.0f32);
        }
        assert_eq!(linear.scale(), 1.0);
    }

    /// gpt-oss's fixture geometry (head_dim 16, theta 1e4, original context 64, beta 8 / 1,
    /// factor 4): frequency 0 kept, 1 and 2 on the ramp, 3.. interpolated; values from transformers
    /// 5.23 `_compute_yarn_parameters` (truncate false).
    #[test]
    fn yarn_matches_transformers() {
        let yarn = RopeScaling::Yarn {
            factor: 4.0,
            beta_fast: 8.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 64.0,
            truncate: false,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
        };
        let got = Rope::new(16, 10000.0, yarn);
        let want = [
            1.0f32,
            0.212_468_68,
            0.025_664_398,
            0.007_905_695,
            0.002_5,
            0.000_790_569_5,
            0.000_25,
            7.905_695e-5,
        ];
        for (g, w) in got.inv_freq().iter().zip(want) {
            assert!(((g - w) / w).abs() < 1e-6, "{g} vs {w}");
        }
        // transformers' attention factor on cos and sin (f32).
        assert_eq!(got.scale(), (0.1 * 4f64.ln() + 1.0) as f32);
        let (mut cos, mut sin) = ([0f32; 8], [0f32; 8]);
        got.cos_sin(0, &mut cos, &mut sin);
        assert_eq!(cos, [got.scale(); 8]);
    }
}

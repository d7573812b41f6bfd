//! The CPU recurrences' rate: the Gated DeltaNet rule (also with Kimi Delta Attention's decay
//! per key channel) and the Mamba-2 scan, token by token in f32 (what hsx runs for every hybrid
//! model, whatever its weights), over one batch of [`REQUESTS`] prompts of [`LEN`] tokens.
//! GFLOP/s counted as the state work per token and head: `7 · dk · dv` for GDN and KDA (decay,
//! `Sᵀk`, the rank-one update, `Sᵀq`; KDA's `dk` decays per token and head not counted),
//! `5 · head_dim · d_state` for Mamba-2 (decay, input, `C·h`); best of [`RUNS`].

use hsx::kernels::cpu::gdn::{GdnParams, gated_delta_rule};
use hsx::kernels::cpu::mamba::{MambaParams, mamba2_scan};
use hsx::kernels::device::GdnDims;
use hsx::kernels::plan::SeqState;

/// Four dimensions of a recurrence (named where used).
type Shape = (usize, usize, usize, usize);

/// (label, (nk, nv, dk, dv), decay per key channel): the hybrid bench model's, Qwen3-Next's
/// and Kimi Linear's (Kimi Delta Attention).
pub const GDN_SHAPES: [(&str, Shape, bool); 3] = [
    ("bench 8/16x64x64", (8, 16, 64, 64), false),
    ("Qwen3-Next 16/32x128x128", (16, 32, 128, 128), false),
    ("Kimi Linear KDA 32/32x128x128", (32, 32, 128, 128), true),
];
/// (label, (heads, head_dim, d_state, groups)): Nemotron-H's and Bamba's.
pub const MAMBA_SHAPES: [(&str, Shape); 2] = [
    ("Nemotron-H 128x64x128 g8", (128, 64, 128, 8)),
    ("Bamba 128x64x128 g1", (128, 64, 128, 1)),
];
pub const REQUESTS: usize = 4;
pub const LEN: usize = 512;
/// Timed runs of each (the best counts: a run of the bench shape is a few milliseconds).
const RUNS: usize = 8;

fn val(i: usize, m: usize) -> f32 {
    ((i * 7919 % m) as f32 / m as f32 - 0.5) * 0.5
}

fn seqs() -> Vec<SeqState> {
    (0..REQUESTS)
        .map(|r| SeqState {
            rows: r * LEN..(r + 1) * LEN,
            slot: r,
            start: 0,
        })
        .collect()
}

/// GFLOP/s of the GDN rule with `nk / nv × dk × dv` heads (a decay per key channel where
/// `per_channel`).
pub fn gdn(pool: &rayon::ThreadPool, (nk, nv, dk, dv): Shape, per_channel: bool) -> f64 {
    let t = REQUESTS * LEN;
    let qkv: Vec<f32> = (0..t * (2 * nk * dk + nv * dv))
        .map(|i| val(i, 1009))
        .collect();
    let b: Vec<f32> = (0..t * nv).map(|i| val(i, 997)).collect();
    let gates = if per_channel { nv * dk } else { nv };
    let a: Vec<f32> = (0..t * gates).map(|i| val(i, 1013)).collect();
    let (neg_a, dt_bias) = (vec![-0.5f32; nv], vec![0.1f32; gates]);
    let p = GdnParams {
        dims: GdnDims { nk, nv, dk, dv },
        neg_a: &neg_a,
        dt_bias: &dt_bias,
        beta_scale: 1.0,
        per_channel,
    };
    let ss = seqs();
    let mut state = vec![0.0f32; REQUESTS * nv * dk * dv];
    let mut out = Vec::new();
    let best = super::best_of(RUNS, || {
        pool.install(|| gated_delta_rule(&qkv, &b, &a, &p, &ss, &mut state, &mut out));
    });
    (7 * dk * dv * nv * t) as f64 / best / 1e9
}

/// GFLOP/s of the Mamba-2 scan with `heads × head_dim × d_state` in `groups` groups.
pub fn mamba(pool: &rayon::ThreadPool, (heads, hd, n, groups): Shape) -> f64 {
    let t = REQUESTS * LEN;
    let xbc: Vec<f32> = (0..t * (heads * hd + 2 * groups * n))
        .map(|i| val(i, 1009))
        .collect();
    let dt: Vec<f32> = (0..t * heads).map(|i| val(i, 997)).collect();
    let (neg_a, d, dt_bias) = (
        vec![-0.5f32; heads],
        vec![1.0f32; heads],
        vec![0.1f32; heads],
    );
    let p = MambaParams {
        heads,
        head_dim: hd,
        d_state: n,
        groups,
        neg_a: &neg_a,
        d: &d,
        dt_bias: &dt_bias,
        dt_min: 0.0,
    };
    let ss = seqs();
    let mut state = vec![0.0f32; REQUESTS * heads * hd * n];
    let mut out = Vec::new();
    let best = super::best_of(RUNS, || {
        pool.install(|| mamba2_scan(&xbc, &dt, &p, &ss, &mut state, &mut out));
    });
    (5 * hd * n * heads * t) as f64 / best / 1e9
}

/// Each recurrence at each of its shapes: (recurrence, shape label, GFLOP/s).
pub fn all(pool: &rayon::ThreadPool) -> Vec<(&'static str, &'static str, f64)> {
    let gdn_rates = GDN_SHAPES.map(|(label, s, per_channel)| {
        let rule = match per_channel {
            true => "gated delta rule, decay per channel",
            false => "gated delta rule",
        };
        (rule, label, gdn(pool, s, per_channel))
    });
    let mamba_rates = MAMBA_SHAPES.map(|(label, s)| ("Mamba-2 scan", label, mamba(pool, s)));
    gdn_rates.into_iter().chain(mamba_rates).collect()
}

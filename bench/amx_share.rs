//! `gemm_peak --amx-share ROUNDS`: the AMX GEMMs' share of the tile peak, the peak probe and
//! the GEMM calls measured in `ROUNDS` interleaved rounds.
//!
//! Why interleaved: on a VM whose host runs other tenants' tile work, the tile unit's rate
//! swings 2–5× over seconds (session 50: two consecutive runs read the 2-thread peak 2,510
//! and 1,777 GFLOP/s, and the GEMM 697 and 1,645). A peak measured minutes before the GEMM
//! compares nothing; each round here measures the peak, then every call, back to back, and
//! the report gives both the best of each over the rounds and the median of the rounds' own
//! shares.
//!
//! The calls are the ones a dense bf16 layer makes (`dense.rs` on the `amx` path), at the
//! dense bench model's shapes: q/k/v (A rounded to bf16 tiles, then 1024 → 1536), o (the
//! same, 1024 → 1024), and the MLP as one call (`matmul_bf16_swiglu_down`: A rounded once,
//! gate/up 1024 → 5632 whose epilogue writes `silu(gate) · up` as the down projection's
//! bf16 tiles, then down 2816 → 1024). Flops are the GEMMs' `2 m k n`; the rounding and the
//! SwiGLU epilogue are inside the time. "Kernel alone" subtracts the time of rounding A
//! (measured in the same round).

use hsx::kernels::Bf16Kernel;
use hsx::kernels::cpu::bf16::{
    Half, PackedHalf, Tile, matmul_bf16, matmul_bf16_swiglu_down, round_tiles,
};

/// The dense bench model: hidden 1024, intermediate 2816, q/k/v out 1536.
const HIDDEN: usize = 1024;
const INTER: usize = 2816;
const QKV: usize = 1536;

/// One call's operands and what it computes.
struct Call {
    name: &'static str,
    flops: f64,
    a: Vec<f32>,
    w: PackedHalf,
    /// The MLP's down weight (`None`: a plain GEMM).
    down: Option<PackedHalf>,
}

/// gemm_peak's operands (A `[rows, HIDDEN]` and `W [n, HIDDEN]` rounded and packed).
fn operands(rows: usize, n: usize) -> (Vec<f32>, PackedHalf) {
    super::half_operands(rows, HIDDEN, n, Half::Bf16)
}

fn calls(rows: usize) -> Vec<Call> {
    let gemm = |k: usize, n: usize| 2.0 * (rows * k * n) as f64;
    let ((qa, qw), (oa, ow), (ma, mw)) = (
        operands(rows, QKV),
        operands(rows, HIDDEN),
        operands(rows, 2 * INTER),
    );
    // The down weight `[HIDDEN, INTER]` (its A is the fused epilogue's output).
    let (_, down) = super::half_operands(rows, INTER, HIDDEN, Half::Bf16);
    vec![
        Call {
            name: "qkv",
            flops: gemm(HIDDEN, QKV),
            a: qa,
            w: qw,
            down: None,
        },
        Call {
            name: "o",
            flops: gemm(HIDDEN, HIDDEN),
            a: oa,
            w: ow,
            down: None,
        },
        Call {
            name: "mlp (gate_up + SwiGLU + down)",
            flops: gemm(HIDDEN, 2 * INTER) + gemm(INTER, HIDDEN),
            a: ma,
            w: mw,
            down: Some(down),
        },
    ]
}

/// The buffers a call writes, kept between calls as the model keeps them (its outputs and
/// the thread-local tiles): a fresh buffer per call would time page faults.
#[derive(Default)]
struct Buffers {
    c: Vec<f32>,
    scratch: Vec<Tile>,
    act: Vec<Tile>,
}

/// Seconds of the best of 3 runs of `call` on `threads` workers.
fn time_call(
    pool: &rayon::ThreadPool,
    call: &Call,
    (rows, threads): (usize, usize),
    b: &mut Buffers,
) -> f64 {
    let run = (threads, Bf16Kernel::Amx);
    super::best_of(3, || {
        pool.install(|| match &call.down {
            None => matmul_bf16(
                &call.a,
                rows,
                &call.w,
                &mut b.c,
                threads,
                Bf16Kernel::Amx,
                &mut b.scratch,
            ),
            Some(d) => {
                let tiles = (&mut b.scratch, &mut b.act);
                matmul_bf16_swiglu_down(&call.a, rows, (&call.w, d), &mut b.c, run, tiles)
            }
        })
    })
}

/// Seconds of rounding `call`'s A into bf16 tiles (once per call, as the calls do).
fn time_round(pool: &rayon::ThreadPool, call: &Call, rows: usize, b: &mut Buffers) -> f64 {
    super::best_of(1, || {
        pool.install(|| {
            round_tiles(&call.a, rows, HIDDEN, call.w.k_tiles(), &mut b.scratch);
        })
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `rounds` rounds (peak probe on 1 and `threads` threads, then each call three times, best
/// kept) and prints the shares.
pub fn run(pool: &rayon::ThreadPool, threads: usize, rows: usize, rounds: usize) {
    let Some(probe) = super::peaks::probe("amx") else {
        println!("amx share: skipped (this CPU has no AMX tiles)");
        return;
    };
    let calls = calls(rows);
    let flops: f64 = calls.iter().map(|c| c.flops).sum();
    // Per call: best seconds of the call and of its rounding, over all rounds.
    let mut best = vec![(f64::MAX, f64::MAX); calls.len()];
    let mut buffers: Vec<Buffers> = calls.iter().map(|_| Buffers::default()).collect();
    let (mut peak1, mut peakn) = (0.0f64, 0.0f64);
    let (mut shares, mut kernel_shares) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (p1, pn) = (
            super::peaks::measure(probe, 1, 100_000),
            super::peaks::measure(probe, threads, 100_000),
        );
        (peak1, peakn) = (peak1.max(p1), peakn.max(pn));
        let (mut secs, mut kernel_secs) = (0.0, 0.0);
        for ((call, best), b) in calls.iter().zip(best.iter_mut()).zip(&mut buffers) {
            let s = time_call(pool, call, (rows, threads), b);
            let r = time_round(pool, call, rows, b);
            *best = (best.0.min(s), best.1.min(r));
            (secs, kernel_secs) = (secs + s, kernel_secs + s - r);
        }
        shares.push(flops / secs / 1e9 / pn);
        kernel_shares.push(flops / kernel_secs / 1e9 / pn);
    }
    println!(
        "amx peak (best of {rounds} rounds): {peak1:.1} GFLOP/s on 1 thread, {peakn:.1} on {threads}"
    );
    for (call, (s, _)) in calls.iter().zip(&best) {
        let g = call.flops / s / 1e9;
        println!(
            "amx {} ({rows} rows): {g:.1} GFLOP/s ({:.0}% of the best peak)",
            call.name,
            100.0 * g / peakn
        );
    }
    let secs: f64 = best.iter().map(|b| b.0).sum();
    let kernel: f64 = best.iter().map(|b| b.0 - b.1).sum();
    let (mix, kmix) = (flops / secs / 1e9, flops / kernel / 1e9);
    println!(
        "amx dense-layer calls on {threads} threads: {mix:.1} GFLOP/s = {:.1}% of the best peak \
         (median of the rounds' own shares {:.1}%); less rounding A: {kmix:.1} = {:.1}% \
         (median {:.1}%)",
        100.0 * mix / peakn,
        100.0 * median(shares),
        100.0 * kmix / peakn,
        100.0 * median(kernel_shares)
    );
}

//! Machine FMA peak and the GEMM rate hsx gets at the benchmark model's shapes.
//!
//! `cargo run --release --example gemm_peak -- [--threads 2] [--rows 2048] [--json]`
//!
//! - FMA peak: independent chains of fused multiply-adds on the widest vectors this build can
//!   use at run time (AVX2+FMA: 8 f32 lanes; else scalar), on 1 and on `--threads` threads.
//! - GEMM: `hsx::kernels::cpu::matmul::matmul_wt` (what the models call) for `--rows` tokens at
//!   the dense benchmark model's projections (hidden 1024, intermediate 2816, 16/4 heads × 64):
//!   qkv 1024→1536, o 1024→1024, gate_up 1024→5632, down 2816→1024, best of 3.

use std::time::Instant;

use hsx::kernels::cpu::matmul::matmul_wt;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// FMA chains per thread; flops per call = 2 * lanes * CHAINS * iters.
const CHAINS: usize = 12;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut s = _mm256_setzero_ps();
    for x in acc {
        s = _mm256_add_ps(s, x);
    }
    let mut out = [0f32; 8];
    // SAFETY: out holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

fn fma_scalar(iters: usize) -> f32 {
    let mut acc = [1.0f32; CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = x.mul_add(0.999_999, 1e-7);
        }
    }
    acc.iter().sum()
}

/// (flops per call, the kernel) for this CPU.
fn fma_kernel() -> (usize, fn(usize) -> f32, &'static str) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just checked.
        return (
            2 * 8 * CHAINS,
            |n| unsafe { fma_avx2(n) },
            "avx2+fma (8 lanes)",
        );
    }
    (2 * CHAINS, fma_scalar, "scalar fma")
}

fn peak(threads: usize) -> f64 {
    let (flops, kernel, _) = fma_kernel();
    let iters = 20_000_000;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let sink: f32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| s.spawn(move || kernel(iters)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let dt = t.elapsed().as_secs_f64();
        std::hint::black_box(sink);
        best = best.max((flops * iters * threads) as f64 / dt / 1e9);
    }
    best
}

fn main() {
    let threads = arg("--threads", 2);
    let rows = arg("--rows", 2048);
    let json = std::env::args().any(|a| a == "--json");
    let (_, _, kind) = fma_kernel();
    let p1 = peak(1);
    let pn = peak(threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let shapes = [
        ("qkv", 1024usize, 1536usize),
        ("o", 1024, 1024),
        ("gate_up", 1024, 5632),
        ("down", 2816, 1024),
    ];
    let mut total_flops = 0.0;
    let mut total_secs = 0.0;
    let mut per = Vec::new();
    for (name, k, n) in shapes {
        let a: Vec<f32> = (0..rows * k)
            .map(|i| ((i % 97) as f32 - 48.0) * 0.01)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i % 89) as f32 - 44.0) * 0.01)
            .collect();
        let mut c = Vec::new();
        let mut best = f64::MAX;
        for _ in 0..4 {
            let t = Instant::now();
            pool.install(|| matmul_wt(&a, rows, k, &w, n, &mut c, threads));
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flops = 2.0 * (rows * k * n) as f64;
        total_flops += flops;
        total_secs += best;
        per.push((name, k, n, flops / best / 1e9));
    }
    let gemm = total_flops / total_secs / 1e9;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "fma": kind, "threads": threads, "peak_1t_gflops": p1, "peak_gflops": pn,
                "rows": rows, "gemm_gflops": gemm,
                "shapes": per.iter().map(|(n, k, m, g)| serde_json::json!({"name": n, "k": k, "n": m, "gflops": g})).collect::<Vec<_>>(),
            })
        );
        return;
    }
    println!("FMA peak ({kind}): {p1:.1} GFLOP/s on 1 thread, {pn:.1} on {threads}");
    for (name, k, n, g) in &per {
        println!(
            "matmul_wt {rows}x{k} -> {n} ({name}): {g:.1} GFLOP/s ({:.0}% of peak)",
            100.0 * g / pn
        );
    }
    println!(
        "dense layer mix: {gemm:.1} GFLOP/s on {threads} threads ({:.0}% of peak)",
        100.0 * gemm / pn
    );
}

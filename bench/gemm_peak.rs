//! Machine FMA peak and the GEMM rate hsx gets at the benchmark model's shapes.
//!
//! `cargo run --release --example gemm_peak -- [--threads 2] [--rows 2048] [--runs 4] [--json]
//! [--only amx|avx512bf16|f32]` (`--runs`: timed calls per measurement, the best kept;
//! `--only`: that bf16 path alone, no peaks or f32 GEMM: for profiling one kernel)
//!
//! - Peaks (`peaks.rs`): register-only probes of each unit the CPU has — AVX2 FMA, AVX-512
//!   FMA, AVX512-BF16 `vdpbf16ps`, AMX `tdpbf16ps` — on 1 and on `--threads` threads; the f32
//!   FMA peak is the widest one's.
//! - Attention (`attention_rate.rs`): the f32 attention kernel, and the bf16 attention of the
//!   `amx` / `avx512bf16` paths where the CPU has them, over one prompt of `--rows` / 2 and of
//!   `--rows` × 2 tokens (1,024 and 4,096), at the bench model's heads (16 / 4 × 64) and an
//!   8B model's (32 / 8 × 128), against the peak of the unit each runs on (f32: the FMA peak).
//!   Then the sparse attention of DSA / QSA (f32; each query of the prompt's second half over
//!   every other block of 4 keys before it). `--attention-only`: that alone (for profiling).
//! - Recurrences (`recurrence_rate.rs`): the Gated DeltaNet rule and the Mamba-2 scan (f32,
//!   token by token, whatever the weights) at the bench hybrid's, Qwen3-Next's, Nemotron-H's
//!   and Bamba's head shapes, against the f32 FMA peak. `--recurrence-only`: that alone.
//! - GEMM: `hsx::kernels::cpu::matmul::matmul_wt` (what the models call) for `--rows` tokens at
//!   the dense benchmark model's projections (hidden 1024, intermediate 2816, 16/4 heads × 64):
//!   qkv 1024→1536, o 1024→1024, gate_up 1024→5632, down 2816→1024, best of 4; then the same
//!   shapes with bf16 weights on each bf16 path this CPU has (`Bf16Kernel`), each against the
//!   peak of the unit it runs on; on the amx / avx512bf16 paths also the kernel alone (the
//!   call's time less that of rounding A to bf16 tiles, timed on its own).
//! - `--amx-share ROUNDS` (`amx_share.rs`): alone, the AMX path's share of the tile peak over
//!   the calls a dense bf16 layer makes (q/k/v, o, the fused MLP), peak and calls measured in
//!   interleaved rounds (on a VM the tile unit's rate swings between seconds).

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

#[path = "peaks.rs"]
mod peaks;

#[path = "attention_rate.rs"]
mod attention_rate;

#[path = "recurrence_rate.rs"]
mod recurrence_rate;

#[path = "amx_share.rs"]
mod amx_share;

use hsx::kernels::Bf16Kernel;
use hsx::kernels::cpu::bf16::{Half, PackedHalf, matmul_bf16, round_tiles};

/// The dense benchmark model's projections: (name, k, n).
const SHAPES: [(&str, usize, usize); 4] = [
    ("qkv", 1024, 1536),
    ("o", 1024, 1024),
    ("gate_up", 1024, 5632),
    ("down", 2816, 1024),
];

/// Best of `--runs` (default 4) seconds of `f`. On a VM whose neighbours load the shared
/// core or its caches, a few runs can all fall in a slow stretch: raise `--runs` there.
fn best_secs(f: impl FnMut()) -> f64 {
    static RUNS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    best_of(*RUNS.get_or_init(|| arg("--runs", 4).max(1)), f)
}

/// The least of `runs` timed calls of `f`, in seconds (the probes' timer).
fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// GFLOP/s per shape and over the mix of `mul(rows, k, n)` (seconds of one product).
fn rates(
    rows: usize,
    mut secs: impl FnMut(usize, usize) -> f64,
) -> (f64, Vec<(&'static str, usize, usize, f64)>) {
    let (mut flops, mut total) = (0.0, 0.0);
    let mut per = Vec::new();
    for (name, k, n) in SHAPES {
        let s = secs(k, n);
        let f = 2.0 * (rows * k * n) as f64;
        flops += f;
        total += s;
        per.push((name, k, n, f / s / 1e9));
    }
    (flops / total / 1e9, per)
}

/// [`operands`] with the weights rounded to `half` and packed.
fn half_operands(rows: usize, k: usize, n: usize, half: Half) -> (Vec<f32>, PackedHalf) {
    let (a, w) = operands(rows, k, n);
    let bits: Vec<u16> = match half {
        Half::Bf16 => w
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect(),
        Half::F16 => w
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect(),
    };
    (a, PackedHalf::pack(&bits, n, k, half))
}

fn operands(rows: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..rows * k)
        .map(|i| ((i % 97) as f32 - 48.0) * 0.01)
        .collect();
    let w = (0..n * k)
        .map(|i| ((i % 89) as f32 - 44.0) * 0.01)
        .collect();
    (a, w)
}

fn main() {
    let threads = arg("--threads", 2);
    let rows = arg("--rows", 2048);
    let json = std::env::args().any(|a| a == "--json");
    let iters = arg("--iters", 20_000_000);
    let args: Vec<String> = std::env::args().collect();
    let only: Option<Bf16Kernel> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| serde_json::from_value(serde_json::json!(v)).expect("--only: a bf16 path"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    if args.iter().any(|a| a == "--amx-share") {
        amx_share::run(&pool, threads, rows, arg("--amx-share", 10).max(1));
        return;
    }
    let attention_only = args.iter().any(|a| a == "--attention-only");
    let recurrence_only = args.iter().any(|a| a == "--recurrence-only");
    // The attention's rate per path, shape and prompt length: (path, label, len, GFLOP/s).
    let attention_paths = [None, Some(Bf16Kernel::Amx), Some(Bf16Kernel::Avx512bf16)]
        .into_iter()
        .filter(|p| p.is_none_or(|k| k.native()));
    // Each shape plain, and the first one soft-capped too (Gemma 2's scores).
    let (plain, capped) = (attention_rate::SHAPES, &attention_rate::SHAPES[..1]);
    let variants = (plain
        .iter()
        .map(|&(l, h, k, d)| (l.to_string(), (h, k, d), None)))
    .chain(capped.iter().map(|&(l, h, k, d)| {
        let cap = attention_rate::SOFT_CAP;
        (format!("{l} soft cap {cap}"), (h, k, d), Some(cap))
    }))
    .collect::<Vec<_>>();
    let attention: Vec<(String, String, usize, f64)> = attention_paths
        .flat_map(|path| variants.iter().map(move |v| (path, v)))
        .filter(|_| only.is_none() && !recurrence_only)
        .flat_map(|(path, (label, shape, cap))| {
            let name = path.map_or_else(|| "f32".to_string(), |k| k.to_string());
            [rows / 2, rows * 2].map(|len| {
                let g = attention_rate::gflops(&pool, len, *shape, (path, *cap));
                (name.clone(), label.clone(), len, g)
            })
        })
        .collect();
    // The sparse attention (DSA / QSA past their dense length; f32 on every path).
    let sparse = (attention_rate::SHAPES.iter())
        .filter(|_| only.is_none() && !recurrence_only)
        .flat_map(|&(label, h, kvh, hd)| {
            [rows / 2, rows * 2].map(|len| {
                let g = attention_rate::sparse_gflops(&pool, len, (h, kvh, hd));
                ("sparse".to_string(), label.to_string(), len, g)
            })
        });
    let attention: Vec<_> = attention.into_iter().chain(sparse).collect();
    let recurrences = if only.is_none() && !attention_only {
        recurrence_rate::all(&pool)
    } else {
        Vec::new()
    };
    if recurrence_only {
        for (what, label, g) in &recurrences {
            println!("{what} {label}: {g:.1} GFLOP/s on {threads} threads");
        }
        return;
    }
    if attention_only {
        for (path, label, len, g) in &attention {
            println!("{path} attention {label}, {len} tokens: {g:.1} GFLOP/s on {threads} threads");
        }
        return;
    }
    // Peaks of every unit this CPU has; the f32 FMA peak is the widest one's.
    let mut units = serde_json::Map::new();
    let mut peak_of = std::collections::HashMap::new();
    for unit in ["avx2", "avx512", "avx512bf16", "amx"] {
        let Some(p) = peaks::probe(unit).filter(|_| only.is_none()) else {
            continue;
        };
        // AMX does ~250x the flops of one FMA chain step per iteration.
        let it = if unit == "amx" { iters / 200 } else { iters };
        let (p1, pn) = (peaks::measure(p, 1, it), peaks::measure(p, threads, it));
        units.insert(
            unit.into(),
            serde_json::json!({"peak_1t_gflops": p1, "peak_gflops": pn}),
        );
        peak_of.insert(unit, (p1, pn));
    }
    let fma = if peak_of.contains_key("avx512") {
        "avx512"
    } else {
        "avx2"
    };
    let (p1, pn) = peak_of.get(fma).copied().unwrap_or((0.0, 0.0));
    // The unit an attention path runs on: its bf16 unit, or the f32 FMA.
    let unit_of = |path: &str| {
        match path {
            "f32" | "sparse" => fma,
            _ => path,
        }
        .to_string()
    };
    let (gemm, per) = rates(rows, |k, n| {
        if only.is_some() {
            return f64::NAN;
        }
        let (a, w) = operands(rows, k, n);
        let mut c = Vec::new();
        best_secs(|| pool.install(|| matmul_wt(&a, rows, k, &w, n, &mut c, threads)))
    });
    // bf16 weights on each path this CPU has, against the peak of the unit it runs on.
    let mut bf16 = Vec::new();
    for path in [
        Bf16Kernel::Amx,
        Bf16Kernel::Avx512bf16,
        Bf16Kernel::Avx512,
        Bf16Kernel::Avx2,
        Bf16Kernel::F32,
    ] {
        if !path.native() || only.is_some_and(|o| o != path) {
            continue;
        }
        let unit = match path {
            Bf16Kernel::Amx => "amx",
            Bf16Kernel::Avx512bf16 => "avx512bf16",
            _ => fma,
        };
        let mut kernel_secs = Vec::new();
        let (mix, per) = rates(rows, |k, n| {
            let (a, packed) = half_operands(rows, k, n, Half::Bf16);
            let (mut c, mut scratch) = (Vec::new(), Vec::new());
            let call = best_secs(|| {
                pool.install(|| matmul_bf16(&a, rows, &packed, &mut c, threads, path, &mut scratch))
            });
            let kt = packed.k_tiles();
            let round = best_secs(|| {
                pool.install(|| {
                    round_tiles(&a, rows, k, kt, &mut scratch);
                })
            });
            kernel_secs.push((2.0 * (rows * k * n) as f64, call - round));
            call
        });
        // The kernel alone: flops over the call's time less the rounding's (the f32 paths
        // round nothing).
        let kernel = matches!(path, Bf16Kernel::Amx | Bf16Kernel::Avx512bf16).then(|| {
            let (f, s) = kernel_secs
                .iter()
                .fold((0.0, 0.0), |(f, s), (fi, si)| (f + fi, s + si));
            f / s / 1e9
        });
        let peak = peak_of.get(unit).map_or(0.0, |p| p.1);
        bf16.push((path, unit, mix, peak, per, kernel));
    }
    // f16 weights on the path they take here (widened in registers), against the FMA peak.
    let f16_path = Bf16Kernel::Auto.for_f16();
    let (f16_mix, f16_per) = rates(rows, |k, n| {
        if only.is_some() {
            return f64::NAN;
        }
        let (a, packed) = half_operands(rows, k, n, Half::F16);
        let (mut c, mut scratch) = (Vec::new(), Vec::new());
        best_secs(|| {
            pool.install(|| matmul_bf16(&a, rows, &packed, &mut c, threads, f16_path, &mut scratch))
        })
    });
    if json {
        let shapes = |per: &[(&str, usize, usize, f64)]| {
            per.iter()
                .map(|(n, k, m, g)| serde_json::json!({"name": n, "k": k, "n": m, "gflops": g}))
                .collect::<Vec<_>>()
        };
        println!(
            "{}",
            serde_json::json!({
                "fma": fma, "threads": threads, "peak_1t_gflops": p1, "peak_gflops": pn,
                "rows": rows, "gemm_gflops": gemm, "shapes": shapes(&per), "units": units,
                "attention": attention.iter().map(|(path, label, len, g)| serde_json::json!({
                    "path": path, "unit": unit_of(path),
                    "shape": label, "len": len, "gflops": g})).collect::<Vec<_>>(),
                "recurrences": recurrences.iter().map(|(what, label, g)| serde_json::json!({
                    "recurrence": what, "shape": label,
                    "tokens": recurrence_rate::REQUESTS * recurrence_rate::LEN,
                    "gflops": g})).collect::<Vec<_>>(),
                "bf16_auto": Bf16Kernel::Auto.resolve().map(|k| k.to_string()).ok(),
                "bf16": bf16.iter().map(|(path, unit, mix, peak, per, kernel)| serde_json::json!({
                    "path": path.to_string(), "unit": unit, "gflops": mix, "unit_peak_gflops": peak,
                    "kernel_gflops": kernel, "shapes": shapes(per)})).collect::<Vec<_>>(),
                "f16": {"path": f16_path.to_string(), "unit": fma, "gflops": f16_mix,
                    "unit_peak_gflops": pn, "shapes": shapes(&f16_per)},
            })
        );
        return;
    }
    for (unit, (p1, pn)) in &peak_of {
        println!("{unit} peak: {p1:.1} GFLOP/s on 1 thread, {pn:.1} on {threads}");
    }
    let report = |what: &str, per: &[(&str, usize, usize, f64)], mix: f64, peak: f64| {
        for (name, k, n, g) in per {
            println!(
                "{what} {rows}x{k} -> {n} ({name}): {g:.1} GFLOP/s ({:.0}% of peak)",
                100.0 * g / peak
            );
        }
        println!(
            "{what}: dense layer mix {mix:.1} GFLOP/s on {threads} threads ({:.0}% of peak)",
            100.0 * mix / peak
        );
    };
    report(&format!("f32 matmul_wt [{fma} peak]"), &per, gemm, pn);
    if only.is_none() {
        let what = format!("f16 weights, {f16_path} [{fma} peak]");
        report(&what, &f16_per, f16_mix, pn);
    }
    for (path, label, len, g) in &attention {
        let unit = unit_of(path);
        let peak = peak_of.get(unit.as_str()).map_or(f64::NAN, |p| p.1);
        println!(
            "{path} attention {label}, one prompt of {len} tokens: {g:.1} GFLOP/s ({:.0}% of the {unit} peak)",
            100.0 * g / peak
        );
    }
    for (what, label, g) in &recurrences {
        println!(
            "f32 {what} {label}, {} x {} tokens: {g:.1} GFLOP/s ({:.0}% of the {fma} peak)",
            recurrence_rate::REQUESTS,
            recurrence_rate::LEN,
            100.0 * g / pn
        );
    }
    for (path, unit, mix, peak, per, kernel) in &bf16 {
        report(
            &format!("bf16 weights, {path} [{unit} peak]"),
            per,
            *mix,
            *peak,
        );
        if let Some(g) = kernel {
            println!(
                "bf16 weights, {path}: the kernel alone (less rounding A) {g:.1} GFLOP/s ({:.0}% of peak)",
                100.0 * g / peak
            );
        }
    }
}

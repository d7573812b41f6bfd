use half::bf16;

use super::*;
use crate::kernels::cpu::matmul::matmul_wt;
use crate::kernels::cpu::matmul::tests::rnd;

fn bits(w: &[f32]) -> Vec<u16> {
    w.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
}

fn widened(w: &[u16]) -> Vec<f32> {
    w.iter().map(|&b| bf16::from_bits(b).to_f32()).collect()
}

/// The concrete paths, each with whether this CPU runs it (a skip line for the others).
fn paths() -> Vec<Bf16Kernel> {
    let mut run = Vec::new();
    for k in [
        Bf16Kernel::Amx,
        Bf16Kernel::Avx512bf16,
        Bf16Kernel::Avx512,
        Bf16Kernel::Avx2,
        Bf16Kernel::Portable,
        Bf16Kernel::F32,
    ] {
        if k.available() {
            if !k.native() {
                println!("bf16 GEMM path {k}: on the emulated tiles (this CPU has no AMX)");
            }
            run.push(k);
        } else {
            println!("skip: bf16 GEMM path {k} (this CPU does not have it)");
        }
    }
    run
}

pub(super) fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
}

pub(super) fn run(k: Bf16Kernel, a: &[f32], m: usize, w: &PackedHalf, threads: usize) -> Vec<f32> {
    let mut c = vec![f32::NAN; 3];
    // A reused scratch holds stale bits (NaN here): the rounding must overwrite the padding.
    let mut scratch = vec![Tile([0xffff; TILE_ELEMS]); 64];
    pool().install(|| matmul_bf16(a, m, w, &mut c, threads, k, &mut scratch));
    c
}

#[test]
fn packing_keeps_every_weight() {
    let mut s = 3;
    let (n, k) = (37, 45);
    let w = bits(&rnd(n * k, &mut s));
    let p = PackedHalf::pack(&w, n, k, Half::Bf16);
    assert_eq!((p.k_padded(), p.column_tiles()), (64, 4));
    let mut row = vec![0f32; k];
    for r in 0..n {
        p.row_into(r, &mut row);
        assert_eq!(row, widened(&w[r * k..(r + 1) * k]), "row {r}");
    }
}

/// Each bf16 path against an f64 product of the same bf16-rounded operands, and against the
/// scalar reference of the same pair order (bit for bit on the emulated AMX tiles); the f32 path against `matmul_wt` on the widened
/// weights, bit for bit. (66, 96, 4000): several AMX blocks of column pairs, bands stored
/// straight into C and an edge band through the scratch; (66, 300, 45): two panels of the
/// f32 path, the second not a whole tile wide, and an odd k.
#[test]
fn every_path_matches_its_reference() {
    let mut s = 11;
    for &(m, n, k) in &[
        (1, 16, 32),
        (5, 37, 45),
        (40, 96, 300),
        (70, 64, 1024),
        (66, 96, 4000),
        (66, 300, 45),
    ] {
        let a = rnd(m * k, &mut s);
        let wb = bits(&rnd(n * k, &mut s));
        let p = PackedHalf::pack(&wb, n, k, Half::Bf16);
        let wf = widened(&wb);
        let mut portable = Vec::new();
        matmul_portable(&a, m, &p, &mut portable);
        for path in paths() {
            let c = run(path, &a, m, &p, 2);
            assert_eq!(c.len(), m * n);
            if path == Bf16Kernel::F32 {
                let mut want = Vec::new();
                matmul_wt(&a, m, k, &wf, n, &mut want, 1);
                assert!(
                    c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{path} m={m} n={n} k={k}: not the f32 product's bits"
                );
                continue;
            }
            if path.widens_in_registers() {
                widened_case(path, &c, &a, (m, n, k), &p, &wf);
                continue;
            }
            if !path.native() {
                // The emulated tiles add in the reference's order (`amx_emu.rs`): its bits.
                let same = c
                    .iter()
                    .zip(&portable)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{path} (emulated) m={m} n={n} k={k}: not the reference's bits"
                );
            }
            let ab = widened(&bits(&a));
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|t| ab[i * k + t] as f64 * wf[j * k + t] as f64)
                        .sum();
                    let scale: f64 = (0..k)
                        .map(|t| (ab[i * k + t] as f64 * wf[j * k + t] as f64).abs())
                        .sum();
                    let (got, refp) = (c[i * n + j] as f64, portable[i * n + j] as f64);
                    let tol = 1e-6 * scale.max(1e-30) + 1e-30;
                    assert!(
                        (got - exact).abs() <= tol,
                        "{path} m={m} n={n} k={k} ({i},{j}): {got} vs exact {exact}"
                    );
                    assert!(
                        (got - refp).abs() <= tol,
                        "{path} ({i},{j}): {got} vs portable {refp}"
                    );
                }
            }
        }
    }
}

/// The avx2 and avx512 paths: the bits of their scalar FMA chain, and within f32 rounding of
/// the f64 product of the f32 activations and the widened weights.
fn widened_case(
    path: Bf16Kernel,
    c: &[f32],
    a: &[f32],
    (m, n, k): (usize, usize, usize),
    p: &PackedHalf,
    wf: &[f32],
) {
    let want = avx2::reference(a, m, p);
    for (i, (x, y)) in c.iter().zip(&want).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{path} m={m} n={n} k={k} at {i}: {x} vs {y}"
        );
    }
    for i in 0..m {
        for j in 0..n {
            let terms = (0..k).map(|t| a[i * k + t] as f64 * wf[j * k + t] as f64);
            let exact: f64 = terms.clone().sum();
            let scale: f64 = terms.map(f64::abs).sum();
            let got = c[i * n + j] as f64;
            assert!(
                (got - exact).abs() <= 1e-6 * scale + 1e-30,
                "{path} ({i},{j}): {got} vs {exact}"
            );
        }
    }
}

/// On each path a row's bits do not depend on M, its position or the thread count.
#[test]
fn rows_are_invariant_on_each_path() {
    let mut s = 5;
    for path in paths() {
        for &(n, k) in &[(48usize, 700usize), (64, 64), (200, 300)] {
            let p = PackedHalf::pack(&bits(&rnd(n * k, &mut s)), n, k, Half::Bf16);
            let row = rnd(k, &mut s);
            let mut reference: Option<Vec<f32>> = None;
            for &m in &[1usize, 2, 13, 33, 65, 300] {
                for pos in [0, m / 2, m - 1] {
                    for threads in [1, 2] {
                        let mut a = rnd(m * k, &mut s);
                        a[pos * k..(pos + 1) * k].copy_from_slice(&row);
                        let c = run(path, &a, m, &p, threads);
                        let got = c[pos * n..(pos + 1) * n].to_vec();
                        match &reference {
                            None => reference = Some(got),
                            Some(r) => assert!(
                                r.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()),
                                "{path} n={n} k={k} m={m} pos={pos} threads={threads}"
                            ),
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn auto_resolves_to_the_fastest_path_and_refuses_a_missing_one() {
    let auto = Bf16Kernel::Auto.resolve().unwrap();
    println!(
        "bf16 GEMM paths here: {:?}; auto = {auto}",
        Bf16Kernel::all_available()
    );
    assert!(auto.native() && auto != Bf16Kernel::Auto);
    // Fastest first: the bf16 units, then the widest f32 FMA over the weights widened in
    // registers; the `gemm` crate's path only without AVX2.
    let order = [
        Bf16Kernel::Amx,
        Bf16Kernel::Avx512bf16,
        Bf16Kernel::Avx512,
        Bf16Kernel::Avx2,
    ];
    let fastest = order.into_iter().find(|k| k.native());
    assert_eq!(
        auto,
        fastest.unwrap_or(Bf16Kernel::F32),
        "auto never takes emulated tiles"
    );
    for k in order {
        if !k.available() {
            assert!(k.resolve().unwrap_err().contains("does not have it"));
        }
    }
}

/// The AMX kernel's k chunks (C out of the tiles and back between chunks) give the bits of C
/// kept in the tiles over the whole of k, for ragged chunks, edge bands and column pairs, and
/// several blocks of pairs; plain and fused.
/// (On the CPU's tiles where it has AMX, else on the emulated ones.)
#[test]
fn amx_chunks_of_k_keep_the_bits() {
    let mut s = 17;
    for &(m, n, k, fused) in &[
        (70, 96, 1100, false),
        (33, 64, 2000, true),
        (5, 2048, 700, false),
    ] {
        let a = rnd(m * k, &mut s);
        let w = PackedHalf::pack(&bits(&rnd(n * k, &mut s)), n, k, Half::Bf16);
        let mut scratch = Vec::new();
        let tiles = round_tiles(&a, m, k, w.k_tiles(), &mut scratch);
        let width = if fused { n / 2 } else { n };
        let run_with = |k_chunk: usize| {
            let mut c = vec![f32::NAN; m * width];
            let out = OutPtr(c.as_mut_ptr());
            let job = Job {
                a: bytemuck::cast_slice(tiles),
                m,
                w: &w,
                pairs: 0..width / PAD_N,
                out: if fused {
                    Out::SiluMul(out)
                } else {
                    Out::Plain(out)
                },
            };
            amx::run_chunked(&job, k_chunk);
            c.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let whole = run_with(w.k_tiles());
        for k_chunk in [1, 3, 16] {
            assert_eq!(
                run_with(k_chunk),
                whole,
                "m {m} n {n} k {k} chunk {k_chunk}"
            );
        }
    }
}

/// The paths with the fused SwiGLU epilogue this CPU runs ([`paths`] prints the skip lines).
fn fused_paths() -> Vec<Bf16Kernel> {
    paths().into_iter().filter(|k| k.fuses_swiglu()).collect()
}

/// The fused SwiGLU epilogue of each bf16 kernel gives the bits of its GEMM then `silu_mul`,
/// for any row count and thread count.
#[test]
fn fused_silu_mul_equals_gemm_then_silu_mul() {
    for path in fused_paths() {
        let mut s = 9;
        for k in [70, 1100] {
            silu_mul_case(path, k, &mut s);
        }
    }
}

fn silu_mul_case(path: Bf16Kernel, k: usize, s: &mut u64) {
    let inter = 96;
    let w = PackedHalf::pack(&bits(&rnd(2 * inter * k, s)), 2 * inter, k, Half::Bf16);
    for (m, threads) in [(1, 1), (33, 2), (130, 2), (7, 3)] {
        let a = rnd(m * k, s);
        let wide = run(path, &a, m, &w, threads);
        let mut want = Vec::new();
        crate::kernels::cpu::ops::silu_mul(&wide, inter, &mut want);
        let (mut got, mut scratch) = (vec![f32::NAN; 5], Vec::new());
        let on = (threads, path);
        pool().install(|| matmul_bf16_silu_mul(&a, m, &w, &mut got, on, &mut scratch));
        let b = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(b(&got), b(&want), "{path} k {k}, m {m}, threads {threads}");
    }
}

/// A MoE expert's fused SwiGLU into its rows of a shared activation buffer gives the bits of
/// the unfused GEMM then `silu_mul`, and leaves the other rows alone.
#[test]
fn expert_rows_fused_equal_gemm_then_silu_mul() {
    for path in fused_paths() {
        expert_rows_case(path);
    }
}

fn expert_rows_case(path: Bf16Kernel) {
    use crate::kernels::cpu::matmul::{Linear, Weight};
    let mut s = 33;
    let (inter, k, m) = (64, 96, 37);
    let w = PackedHalf::pack(&bits(&rnd(2 * inter * k, &mut s)), 2 * inter, k, Half::Bf16);
    let lin = Linear {
        w: Weight::Half {
            w: w.clone(),
            kernel: path,
        },
        b: None,
        out: 2 * inter,
        inp: k,
    };
    let a = rnd(m * k, &mut s);
    let mut wide = Vec::new();
    let mut want = Vec::new();
    pool().install(|| lin.forward(&a, m, &mut wide, 2));
    crate::kernels::cpu::ops::silu_mul(&wide, inter, &mut want);
    // The expert's rows 5..5 + m of a 50-row buffer of NaN.
    let mut shared = vec![f32::NAN; 50 * inter];
    let rows = &mut shared[5 * inter..(5 + m) * inter];
    assert!(pool().install(|| lin.forward_silu_mul_into(&a, m, rows, 2)));
    let b = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(b(&shared[5 * inter..(5 + m) * inter]), b(&want), "{path}");
    assert!(
        shared[..5 * inter]
            .iter()
            .chain(&shared[(5 + m) * inter..])
            .all(|v| v.is_nan())
    );
}

/// The whole fused MLP (the epilogue rounding `silu(gate) · up` into the down projection's
/// tiles) gives the bits of the fused SwiGLU then the down GEMM, with both reused buffers
/// starting from stale NaN bits (the padding rows of the tiles must be written).
#[test]
fn fused_mlp_equals_swiglu_then_down() {
    for path in fused_paths() {
        fused_mlp_case(path);
    }
}

fn fused_mlp_case(path: Bf16Kernel) {
    let mut s = 21;
    let (inter, k, n) = (96, 70, 50);
    let gate_up = PackedHalf::pack(&bits(&rnd(2 * inter * k, &mut s)), 2 * inter, k, Half::Bf16);
    let down = PackedHalf::pack(&bits(&rnd(n * inter, &mut s)), n, inter, Half::Bf16);
    let stale = || vec![Tile([0xffff; TILE_ELEMS]); 40];
    let (mut scratch, mut act) = (stale(), stale());
    for (m, threads) in [(1, 1), (33, 2), (130, 2), (7, 3), (64, 1)] {
        let a = rnd(m * k, &mut s);
        let mut mid = Vec::new();
        let mut s2 = Vec::new();
        let on = (threads, path);
        pool().install(|| matmul_bf16_silu_mul(&a, m, &gate_up, &mut mid, on, &mut s2));
        let want = run(path, &mid, m, &down, threads);
        let mut got = vec![f32::NAN; 3];
        pool().install(|| {
            let (w, bufs) = ((&gate_up, &down), (&mut scratch, &mut act));
            matmul_bf16_swiglu_down(&a, m, w, &mut got, on, bufs)
        });
        let b = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(b(&got), b(&want), "{path} m {m}, threads {threads}");
    }
}

//! f16 weights kept as f16: packed in their own tile-row order, widened in registers on the
//! `avx2` / `avx512` paths (the bits of the scalar FMA chain) or panel by panel on `f32` (the
//! bits of `matmul_wt` on the widened weights); the paths that round to bf16 never take them.

use half::f16;

use super::tests::run;
use super::*;
use crate::kernels::cpu::matmul::matmul_wt;
use crate::kernels::cpu::matmul::tests::rnd;

fn bits(w: &[f32]) -> Vec<u16> {
    w.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}

fn widened(w: &[u16]) -> Vec<f32> {
    w.iter().map(|&b| f16::from_bits(b).to_f32()).collect()
}

/// The paths f16 weights take that this CPU runs (a skip line for the others).
fn paths() -> Vec<Bf16Kernel> {
    let mut run = Vec::new();
    for k in [Bf16Kernel::Avx512, Bf16Kernel::Avx2, Bf16Kernel::F32] {
        match k.available() {
            true => run.push(k),
            false => println!("skip: f16 GEMM path {k} (this CPU does not have it)"),
        }
    }
    run
}

fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// Every f16 value (subnormals, infinities, NaN payloads, -0) comes back exactly, at every
/// row and input of a ragged shape; a bf16 packing of the same bits reads them as bf16.
#[test]
fn f16_packing_keeps_every_weight() {
    let (n, k) = (37, 45);
    let mut w: Vec<u16> = (0..n * k)
        .map(|i| (i as u16).wrapping_mul(40_503))
        .collect();
    w[..6].copy_from_slice(&[0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7e01, 0x8000]);
    let p = PackedHalf::pack(&w, n, k, Half::F16);
    let b = PackedHalf::pack(&w, n, k, Half::Bf16);
    assert_eq!((p.k_padded(), p.column_tiles()), (64, 4));
    let (mut row, mut brow) = (vec![0f32; k], vec![0f32; k]);
    for r in 0..n {
        p.row_into(r, &mut row);
        let want = widened(&w[r * k..(r + 1) * k]);
        assert!(
            row.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "row {r}"
        );
        b.row_into(r, &mut brow);
        let as_bf16 = w[r * k..(r + 1) * k]
            .iter()
            .map(|&x| bf16::from_bits(x).to_f32());
        assert!(
            brow.iter()
                .zip(as_bf16)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
    }
}

/// Each f16 path against its reference, bit for bit, and within f32 rounding of the f64
/// product; a path that rounds to bf16, handed f16 weights, multiplies them in f32.
#[test]
fn f16_paths_match_their_references() {
    let mut s = 23;
    for &(m, n, k) in &[(1, 16, 32), (5, 37, 45), (40, 96, 300), (66, 300, 1024)] {
        let a = rnd(m * k, &mut s);
        let wb = bits(&rnd(n * k, &mut s));
        let p = PackedHalf::pack(&wb, n, k, Half::F16);
        let wf = widened(&wb);
        let mut f32_product = Vec::new();
        matmul_wt(&a, m, k, &wf, n, &mut f32_product, 1);
        for path in paths() {
            let c = run(path, &a, m, &p, 2);
            let want = match path {
                Bf16Kernel::F32 => f32_product.clone(),
                _ => avx2::reference(&a, m, &p),
            };
            assert!(same_bits(&c, &want), "{path} m={m} n={n} k={k}");
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
        for path in [
            Bf16Kernel::Amx,
            Bf16Kernel::Avx512bf16,
            Bf16Kernel::Portable,
        ] {
            let c = run(path, &a, m, &p, 2);
            assert!(same_bits(&c, &f32_product), "{path} on f16 weights");
        }
    }
}

/// On each f16 path a row's bits do not depend on M, its position or the thread count.
#[test]
fn f16_rows_are_invariant_on_each_path() {
    let mut s = 7;
    for path in paths() {
        for &(n, k) in &[(48usize, 700usize), (200, 300)] {
            let p = PackedHalf::pack(&bits(&rnd(n * k, &mut s)), n, k, Half::F16);
            let row = rnd(k, &mut s);
            let mut reference: Option<Vec<f32>> = None;
            for &m in &[1usize, 13, 65, 300] {
                for (pos, threads) in [(0, 1), (m / 2, 2), (m - 1, 2)] {
                    let mut a = rnd(m * k, &mut s);
                    a[pos * k..(pos + 1) * k].copy_from_slice(&row);
                    let c = run(path, &a, m, &p, threads);
                    let got = c[pos * n..(pos + 1) * n].to_vec();
                    match &reference {
                        None => reference = Some(got),
                        Some(r) => assert!(same_bits(r, &got), "{path} n={n} k={k} m={m}"),
                    }
                }
            }
        }
    }
}

/// f16 weights take the widest path that widens in registers wherever bf16 weights would
/// round to bf16; `avx2` and `f32` stay; `portable` (bf16 rounding) becomes `f32`.
#[test]
fn f16_weights_take_a_widening_path() {
    let best = [Bf16Kernel::Avx512, Bf16Kernel::Avx2]
        .into_iter()
        .find(|k| k.available())
        .unwrap_or(Bf16Kernel::F32);
    for k in [
        Bf16Kernel::Auto,
        Bf16Kernel::Amx,
        Bf16Kernel::Avx512bf16,
        Bf16Kernel::Avx512,
    ] {
        assert_eq!(k.for_f16(), best, "{k}");
    }
    let avx2 = match Bf16Kernel::Avx2.available() {
        true => Bf16Kernel::Avx2,
        false => Bf16Kernel::F32,
    };
    assert_eq!(Bf16Kernel::Avx2.for_f16(), avx2);
    assert_eq!(Bf16Kernel::F32.for_f16(), Bf16Kernel::F32);
    assert_eq!(Bf16Kernel::Portable.for_f16(), Bf16Kernel::F32);
    for k in [Bf16Kernel::Auto, Bf16Kernel::Portable, Bf16Kernel::F32] {
        assert!(k.for_f16().widens_in_registers() || k.for_f16() == Bf16Kernel::F32);
    }
}

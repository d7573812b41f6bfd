//! `C = A · Wᵀ` (torch Linear layout) on the `gemm` crate, with per-row results that do not
//! depend on how many rows are in the call.
//!
//! # Row invariance (DESIGN.md §7 a)
//!
//! gemm 0.19 (checked in gemm-common's `gemm_basic_generic` and measured, bit for bit, with
//! identical rows at several positions of A, `Parallelism::None` vs `Rayon(2|3)`) computes a row
//! differently depending on the shape of the call. With row-major `C[M,N] = A[M,K]·Wᵀ` gemm
//! transposes internally (m' = N, n' = M) and then picks:
//! - M = 1: a GEMV kernel (different summation order);
//! - M·N <= 256: the "horizontal" dot-product kernels (seen with N = 64 and M <= 4);
//! - M <= 64 and N <= 64: a small-size path whose K block is `min(K, 512)`, while larger calls
//!   split K evenly into blocks from `kernel_params` (seen with N = 64, K = 700: M = 37 or 64
//!   differ from M = 65).
//!
//! For M >= 65 every call goes through the general blocked path, whose K blocking depends only
//! on K (and the cache sizes), whose micro-kernels accumulate each output along K in the same
//! order whatever the row's position in the tile, and which never splits K across threads.
//! Measured: identical bits for M in {65, 66, 72, 100, 129, 257, 512, 1000}, rows at the first,
//! middle and last positions, 1/2/3 threads, N in {16..4096}, K in {64..2000}.
//! So calls with fewer than [`MIN_ROWS`] rows are zero-padded up to it. The cost is small: the
//! padded call runs the fast blocked kernel instead of a GEMV (a single-row step is ~4x slower
//! than a GEMV, which only matters for decode-style steps, not prefill).

use gemm::Parallelism;

use super::bf16::{
    Bf16Kernel, Half, PackedHalf, Tile, matmul_bf16_into, matmul_bf16_silu_mul_into,
    matmul_bf16_swiglu_down,
};

/// Smallest M handed to gemm (see the module docs).
pub const MIN_ROWS: usize = 65;

/// A linear layer's weight `[out, inp]`: f32 (torch layout, row-major), or bf16 / f16 kept
/// as such in tiles with the kernel that multiplies it.
#[derive(Debug, Clone)]
pub enum Weight {
    F32(Vec<f32>),
    Half { w: PackedHalf, kernel: Bf16Kernel },
}

/// A linear layer: weight `[out, inp]`, optional bias `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub w: Weight,
    pub b: Option<Vec<f32>>,
    pub out: usize,
    pub inp: usize,
}

impl Linear {
    /// `y[m, out] = x[m, inp] · Wᵀ (+ b)`; `y` is resized to `m * out` (every element is
    /// written: resizing zeroes only growth).
    pub fn forward(&self, x: &[f32], m: usize, y: &mut Vec<f32>, threads: usize) {
        y.resize(m * self.out, 0.0);
        self.forward_into(x, m, y, threads);
    }

    /// [`Linear::forward`] into `y` (`m * out` values, every one written): rows of a larger
    /// buffer (a MoE expert's rows) without a copy.
    pub fn forward_into(&self, x: &[f32], m: usize, y: &mut [f32], threads: usize) {
        match &self.w {
            Weight::F32(w) => matmul_wt_into(x, m, self.inp, w, self.out, y, threads),
            Weight::Half { w, kernel } => BF16_SCRATCH
                .with_borrow_mut(|scratch| matmul_bf16_into(x, m, w, y, threads, *kernel, scratch)),
        }
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(self.out) {
                for (v, bi) in row.iter_mut().zip(b) {
                    *v += *bi;
                }
            }
        }
    }

    /// `y[m, out / 2] = silu(gate) · up` of `x · Wᵀ` for a stacked `[gate | up]` weight,
    /// fused into the GEMM where its path allows (bf16 on `amx` or `avx512bf16`, no bias,
    /// `out / 2` a multiple of 32: the `[m, out]` projection is never written); false: not
    /// done here, run [`Linear::forward`] and `ops::silu_mul` (the same bits).
    pub fn forward_silu_mul(&self, x: &[f32], m: usize, y: &mut Vec<f32>, threads: usize) -> bool {
        if self.silu_mul_weight().is_none() {
            return false;
        }
        y.resize(m * self.out / 2, 0.0);
        self.forward_silu_mul_into(x, m, y, threads)
    }

    /// [`Linear::forward_silu_mul`] into `y` (`m * out / 2` values, every one written when
    /// true): a MoE expert's rows of the shared activation.
    pub fn forward_silu_mul_into(
        &self,
        x: &[f32],
        m: usize,
        y: &mut [f32],
        threads: usize,
    ) -> bool {
        let Some((w, kernel)) = self.silu_mul_weight() else {
            return false;
        };
        BF16_SCRATCH
            .with_borrow_mut(|s| matmul_bf16_silu_mul_into(x, m, w, y, (threads, kernel), s));
        true
    }

    /// The packed weight and its path, when the SwiGLU epilogue takes this weight: bf16 on
    /// `amx` or `avx512bf16`, no bias, `out / 2` a multiple of 32.
    fn silu_mul_weight(&self) -> Option<(&PackedHalf, Bf16Kernel)> {
        self.fused_bf16().filter(|_| self.out.is_multiple_of(64))
    }

    /// The SwiGLU MLP `y[m, down.out] = down(silu(gate) · up)` of `x · Wᵀ` for a stacked
    /// `[gate | up]` weight, with `silu(gate) · up` going from the first GEMM's epilogue
    /// straight into the second's bf16 tiles where both are bf16 on `amx` or `avx512bf16`
    /// (the same path) without bias and `out / 2` is a multiple of 32; false: not done here,
    /// run [`Linear::forward_silu_mul`] (or its unfused form) then `down.forward` (the same
    /// bits).
    pub fn forward_swiglu_down(
        &self,
        down: &Linear,
        x: &[f32],
        m: usize,
        y: &mut Vec<f32>,
        threads: usize,
    ) -> bool {
        let (Some((gate_up, kernel)), Some((dw, dk))) = (self.silu_mul_weight(), down.fused_bf16())
        else {
            return false;
        };
        if down.inp != self.out / 2 || kernel != dk {
            return false;
        }
        BF16_SCRATCH.with_borrow_mut(|s| {
            ACT_TILES.with_borrow_mut(|act| {
                let run = (threads, kernel);
                matmul_bf16_swiglu_down(x, m, (gate_up, dw), y, run, (s, act))
            })
        });
        true
    }

    /// The packed weight and its path, when it is bf16 on a path with the fused SwiGLU
    /// epilogue (`amx`, `avx512bf16`) and there is no bias.
    fn fused_bf16(&self) -> Option<(&PackedHalf, Bf16Kernel)> {
        match &self.w {
            Weight::Half { w, kernel }
                if kernel.fuses_swiglu() && self.b.is_none() && w.half == Half::Bf16 =>
            {
                Some((w, *kernel))
            }
            _ => None,
        }
    }

    /// Row `r` of the weight (an embedding row), widened into `out[..inp]`.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match &self.w {
            Weight::F32(w) => out[..self.inp].copy_from_slice(&w[r * self.inp..(r + 1) * self.inp]),
            Weight::Half { w, .. } => w.row_into(r, out),
        }
    }
}

thread_local! {
    /// The activations rounded to bf16, reused by every call on this thread.
    static BF16_SCRATCH: std::cell::RefCell<Vec<Tile>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The fused SwiGLU's output in bf16 tiles, the down projection's input.
    static ACT_TILES: std::cell::RefCell<Vec<Tile>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `c[m, n] = a[m, k] · w[n, k]ᵀ`, row-invariant (see the module docs). `threads` is the
/// rayon parallelism (call from inside the pool that should run it).
pub fn matmul_wt(
    a: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    c: &mut Vec<f32>,
    threads: usize,
) {
    // gemm overwrites all of `c` without reading it (`read_dst = false`), so a reused buffer
    // is not zeroed first (resizing zeroes only growth): no pass over tens of MB per call.
    c.resize(m * n, 0.0);
    matmul_wt_into(a, m, k, w, n, c, threads);
}

/// [`matmul_wt`] into `c` (`m * n` values, every one written).
pub fn matmul_wt_into(
    a: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    c: &mut [f32],
    threads: usize,
) {
    assert_eq!(c.len(), m * n, "matmul_wt: output is not [m, n]");
    matmul_wt_rows(a, m, k, w, n, (c, n), threads);
}

/// [`matmul_wt`] into columns `0..n` of the rows of `c` (`ldc` values apart; the rest of
/// each row untouched): one panel of a wider product written in place, no copy out. Same
/// bits as [`matmul_wt`]: the output's row stride changes where gemm stores, not its sums.
pub(crate) fn matmul_wt_rows(
    a: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    (c, ldc): (&mut [f32], usize),
    threads: usize,
) {
    assert_eq!(a.len(), m * k, "matmul_wt: lhs is not [m, k]");
    assert_eq!(w.len(), n * k, "matmul_wt: weight is not [n, k]");
    assert!(ldc >= n, "matmul_wt: row stride {ldc} under the width {n}");
    assert!(
        m == 0 || c.len() >= (m - 1) * ldc + n,
        "matmul_wt: output does not hold {m} rows of stride {ldc}"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.chunks_mut(ldc).take(m).for_each(|row| row[..n].fill(0.0));
        return;
    }
    if m >= MIN_ROWS {
        gemm_raw(a, m, k, w, n, (c, ldc), threads);
        return;
    }
    let mut padded = vec![0.0f32; MIN_ROWS * k];
    padded[..m * k].copy_from_slice(a);
    let mut out = vec![0.0f32; MIN_ROWS * n];
    gemm_raw(&padded, MIN_ROWS, k, w, n, (&mut out, n), threads);
    for (dst, src) in c.chunks_mut(ldc).zip(out.chunks_exact(n)).take(m) {
        dst[..n].copy_from_slice(src);
    }
}

fn gemm_raw(
    a: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    (c, ldc): (&mut [f32], usize),
    threads: usize,
) {
    debug_assert!(a.len() == m * k && w.len() == n * k && c.len() >= (m - 1) * ldc + n);
    let parallelism = if threads <= 1 {
        Parallelism::None
    } else {
        Parallelism::Rayon(threads)
    };
    // SAFETY: the slices hold every element the strides below address: c is m rows of n
    // values `ldc` apart (col stride 1; checked by the caller), a is [m, k] row-major, and
    // the rhs `wᵀ` is [k, n] read from w [n, k] (col stride k, row stride 1). c does not
    // alias a or w.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `n` values in [-0.5, 0.5) from an LCG (the kernels' tests share it).
    pub(crate) fn rnd(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    #[test]
    fn matches_naive() {
        let mut s = 1;
        let (m, k, n) = (5, 33, 7);
        let a = rnd(m * k, &mut s);
        let w = rnd(n * k, &mut s);
        let mut c = Vec::new();
        matmul_wt(&a, m, k, &w, n, &mut c, 1);
        for i in 0..m {
            for j in 0..n {
                let r: f64 = (0..k)
                    .map(|t| a[i * k + t] as f64 * w[j * k + t] as f64)
                    .sum();
                assert!((c[i * n + j] as f64 - r).abs() < 1e-5);
            }
        }
    }

    /// The same row gives the same bits whatever M, its position and the thread count.
    #[test]
    fn row_invariant_across_m_position_threads() {
        let mut s = 7;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for &(n, k) in &[
            (16usize, 700usize),
            (64, 64),
            (64, 700),
            (96, 513),
            (200, 300),
        ] {
            let w = rnd(n * k, &mut s);
            let row = rnd(k, &mut s);
            let mut reference: Option<Vec<f32>> = None;
            for &m in &[1usize, 2, 4, 37, 64, 65, 130, 512] {
                for pos in [0, m / 2, m - 1] {
                    for threads in [1, 2] {
                        let mut a = rnd(m * k, &mut s);
                        a[pos * k..(pos + 1) * k].copy_from_slice(&row);
                        let mut c = Vec::new();
                        pool.install(|| matmul_wt(&a, m, k, &w, n, &mut c, threads));
                        let got = c[pos * n..(pos + 1) * n].to_vec();
                        match &reference {
                            None => reference = Some(got),
                            Some(r) => assert!(
                                r.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()),
                                "n={n} k={k} m={m} pos={pos} threads={threads}"
                            ),
                        }
                    }
                }
            }
        }
    }

    /// A product written into columns of a wider output has the bits of the same product
    /// on its own, every M (padded small calls included), and leaves the other columns alone.
    #[test]
    fn rows_of_a_wider_output_are_the_plain_product() {
        let mut s = 11;
        let (k, n, ldc, c0) = (300usize, 40usize, 100usize, 30usize);
        let w = rnd(n * k, &mut s);
        for m in [1usize, 7, 65, 130] {
            let a = rnd(m * k, &mut s);
            let mut plain = Vec::new();
            matmul_wt(&a, m, k, &w, n, &mut plain, 2);
            let mut wide = vec![f32::NAN; m * ldc];
            matmul_wt_rows(&a, m, k, &w, n, (&mut wide[c0..], ldc), 2);
            for (r, row) in wide.chunks_exact(ldc).enumerate() {
                let got = &row[c0..c0 + n];
                let want = &plain[r * n..(r + 1) * n];
                assert!(
                    got.iter()
                        .zip(want)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "m={m} row {r}"
                );
                let mut others = row[..c0].iter().chain(&row[c0 + n..]);
                assert!(others.all(|v| v.is_nan()), "m={m} row {r}");
            }
        }
    }
}

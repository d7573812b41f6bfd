//! Register-only peak probes of each arithmetic unit a GEMM path runs on (no memory traffic):
//! AVX2 FMA, AVX-512 FMA, AVX512-BF16 `vdpbf16ps` and AMX `tdpbf16ps`. Each returns the
//! flops of one call of `iters` iterations and the call, or None when the CPU lacks the unit.

/// Independent accumulator chains per thread.
const CHAINS: usize = 12;

/// (flops per iteration, kernel over `iters` iterations).
pub type Probe = (usize, fn(usize) -> f32);

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::CHAINS;

    #[target_feature(enable = "avx2,fma")]
    pub fn fma_avx2(iters: usize) -> f32 {
        let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, x| _mm256_add_ps(s, *x));
        let mut out = [0f32; 8];
        // SAFETY: out holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }

    #[target_feature(enable = "avx512f")]
    pub fn fma_avx512(iters: usize) -> f32 {
        let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        _mm512_reduce_add_ps(
            acc.iter()
                .fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x)),
        )
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub fn dpbf16(iters: usize) -> f32 {
        // SAFETY: bit casts of broadcast bf16 pairs (1.0, 1e-3-ish).
        let (a, b): (__m512bh, __m512bh) = unsafe {
            (
                std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3f80_3f80)),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3a83_3a83)),
            )
        };
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, a, b);
            }
        }
        _mm512_reduce_add_ps(
            acc.iter()
                .fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x)),
        )
    }

    #[cfg(target_os = "linux")]
    pub fn amx(iters: usize) -> f32 {
        use std::arch::asm;
        #[repr(C, align(64))]
        struct Cfg([u8; 64]);
        let mut cfg = Cfg([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64;
            cfg.0[48 + t] = 16;
        }
        // Operands of varied bf16 values in [-1, 1): on zero tiles tdpbf16ps runs ~25% faster
        // than on real data (measured on Sapphire Rapids: 3,110 vs 2,480 GFLOP/s on 1 thread),
        // which would overstate the peak the GEMM is judged against.
        let mut bits = [0u16; 512];
        let mut x = 12_345u32;
        for b in bits.iter_mut() {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let v = (x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
            *b = (v.to_bits() >> 16) as u16;
        }
        // SAFETY: called only when AMX is permitted (hsx's bf16 kernel asked); register tiles
        // only, loaded from a 1 KiB buffer.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
            asm!("tileloadd tmm4, [{p} + {s}*1]", "tileloadd tmm5, [{p} + {s}*1]",
                 "tileloadd tmm6, [{p} + {s}*1]", "tileloadd tmm7, [{p} + {s}*1]",
                 "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                 p = in(reg) bits.as_ptr(), s = in(reg) 64usize, options(nostack, readonly));
            for _ in 0..iters {
                asm!(
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    options(nostack, nomem)
                );
            }
            asm!("tilerelease", options(nostack, nomem));
        }
        0.0
    }
}

/// The probe of `unit` ("avx2", "avx512", "avx512bf16", "amx") on this CPU.
pub fn probe(unit: &str) -> Option<Probe> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        // SAFETY (each closure): the features were just checked.
        match unit {
            "avx2" if has!("avx2") && has!("fma") => {
                Some((2 * 8 * CHAINS, |n| unsafe { x86::fma_avx2(n) }))
            }
            "avx512" if has!("avx512f") => {
                Some((2 * 16 * CHAINS, |n| unsafe { x86::fma_avx512(n) }))
            }
            "avx512bf16" if has!("avx512f") && has!("avx512bf16") => {
                Some((4 * 16 * CHAINS, |n| unsafe { x86::dpbf16(n) }))
            }
            #[cfg(target_os = "linux")]
            "amx" if hsx::kernels::Bf16Kernel::Amx.native() => {
                Some((4 * 2 * 16 * 16 * 32, x86::amx))
            }
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Best of 3 GFLOP/s of `probe` on `threads` threads.
pub fn measure((flops, kernel): Probe, threads: usize, iters: usize) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = std::time::Instant::now();
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

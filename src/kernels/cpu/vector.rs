//! Plain Rust loops compiled for the widest vector unit the CPU has, chosen at run time.
//!
//! The crate is built for baseline x86-64, so the auto-vectorised element-wise loops of the
//! recurrent layers (conv, gated delta rule, Mamba-2 scan) ran on 4-lane SSE. [`widest`] runs a
//! closure through a copy of itself compiled with AVX-512F or AVX2 enabled (the closure is
//! inlined into the `#[target_feature]` function, so LLVM vectorises it for that unit).
//!
//! Both units come with FMA, so an explicit `mul_add` (always fused, whatever the unit: on
//! baseline x86-64 it is a call to libm's `fmaf`) becomes one vector instruction.
//!
//! Same bits on every path: Rust never contracts `a * b + c` into an FMA and LLVM keeps the
//! order of floating-point reductions, so the vector code does each element's operations in
//! the scalar order (tests: `recurrent::tests::*_same_bits_on_every_vector_unit`).

/// The vector units [`widest`] can compile for (each with FMA), widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Avx512,
    Avx2,
    Baseline,
}

impl Unit {
    /// The widest unit this CPU has.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            static UNIT: std::sync::OnceLock<Unit> = std::sync::OnceLock::new();
            *UNIT.get_or_init(|| {
                let fma = is_x86_feature_detected!("fma");
                if fma && is_x86_feature_detected!("avx512f") {
                    Unit::Avx512
                } else if fma && is_x86_feature_detected!("avx2") {
                    Unit::Avx2
                } else {
                    Unit::Baseline
                }
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Unit::Baseline
    }

    /// Whether this CPU can run code compiled for the unit.
    pub fn available(self) -> bool {
        match (self, Self::detect()) {
            (Unit::Baseline, _) | (_, Unit::Avx512) => true,
            (Unit::Avx2, u) => u == Unit::Avx2,
            (Unit::Avx512, _) => false,
        }
    }
}

/// `f()`, compiled for the widest unit this CPU has.
#[inline(always)]
pub fn widest<R>(f: impl FnOnce() -> R) -> R {
    on(Unit::detect(), f)
}

/// `f()`, compiled for `unit` (which must be [`Unit::available`]; tests compare the units).
#[inline(always)]
pub fn on<R>(unit: Unit, f: impl FnOnce() -> R) -> R {
    assert!(unit.available(), "vector unit {unit:?} missing on this CPU");
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,fma")]
        fn avx512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        match unit {
            // SAFETY: the CPU has the unit (asserted above).
            Unit::Avx512 => unsafe { avx512(f) },
            // SAFETY: as above.
            Unit::Avx2 => unsafe { avx2(f) },
            Unit::Baseline => f(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    f()
}

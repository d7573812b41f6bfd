//! CPU backend: f32 compute, gemm + rayon.

//! `y[M, N] = x[M, K] · W[N, K]ᵀ` on cuBLAS: W in f32 / bf16 / f16, x in the same dtype, y in
//! f32, always accumulated in f32 (`CUBLAS_COMPUTE_32F`: no TF32 for f32 models, so they match
//! the CPU backend to ~1e-6).
//!
//! cuBLAS is column-major: row-major `y = x · Wᵀ` is column-major `yᵀ = W'ᵀ · x'` where `W'`
//! (K × N, ld K) and `x'` (K × M, ld K) are the same bytes, so `transa = T`, `transb = N`,
//! `m = N`, `n = M`.
//!
//! Not checked without a GPU: whether cuBLAS picks kernels whose per-row result depends on M
//! (DESIGN.md §7a); the parity tests compare with a tolerance.

use std::ffi::c_void;

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};

use super::context::{CudaError, CudaResult, Gpu};
use super::weights::DevWeight;
use crate::models::WeightDtype;

fn data_type(d: WeightDtype) -> cudaDataType {
    match d {
        WeightDtype::F32 => cudaDataType::CUDA_R_32F,
        WeightDtype::Bf16 => cudaDataType::CUDA_R_16BF,
        WeightDtype::F16 => cudaDataType::CUDA_R_16F,
    }
}

fn c_int(v: usize, what: &str) -> CudaResult<i32> {
    i32::try_from(v).map_err(|_| CudaError::Invalid(format!("gemm {what} = {v} exceeds i32")))
}

/// `y[m, w.rows] = x[m, w.cols] · wᵀ`, with `x` (device address) in `w`'s dtype and `y` an
/// f32 buffer of at least `m * w.rows` elements. `m == 0` does nothing.
pub fn linear(gpu: &Gpu, x: u64, w: &DevWeight, y: u64, m: usize) -> CudaResult<()> {
    if m == 0 {
        return Ok(());
    }
    let (n, k) = (c_int(w.rows, "N")?, c_int(w.cols, "K")?);
    let mi = c_int(m, "M")?;
    let dt = data_type(w.data.dtype());
    let (alpha, beta) = (1.0f32, 0.0f32);
    gpu.ctx.bind_to_thread()?;
    // SAFETY: `w` holds n × k elements; the caller passes `x` with m × k elements of the same
    // dtype and `y` with m × n f32 elements, all live device memory on this context. The handle
    // is bound to the compute stream, so the GEMM is ordered with the kernels around it.
    unsafe {
        gemm_ex(
            *gpu.blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            n,
            mi,
            k,
            &alpha as *const f32 as *const c_void,
            w.data.ptr() as *const c_void,
            dt,
            k,
            x as *const c_void,
            dt,
            k,
            &beta as *const f32 as *const c_void,
            y as *mut c_void,
            cudaDataType::CUDA_R_32F,
            n,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )?;
    }
    Ok(())
}

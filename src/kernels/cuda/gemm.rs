//! Weights on the device ([`DevWeight`], in their stored dtype) and
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

use super::context::{CudaError, CudaResult, DevBuf, Gpu};
use super::driver::{GemmEx, Op, Stream};
use crate::kernels::device::HostMatrix;
use crate::kernels::dtype::{WeightDtype, dtype_size};

/// A matrix `[rows, cols]` (torch Linear layout `[out, in]`) on the device.
pub struct DevWeight {
    pub data: WeightData,
    pub rows: usize,
    pub cols: usize,
}

impl DevWeight {
    /// Uploads `m`'s bytes as they are (bf16 and f16 stay 16-bit; no host conversion).
    pub fn upload(gpu: &Gpu, m: &HostMatrix<'_>) -> CudaResult<Self> {
        let len = m.rows.saturating_mul(m.cols);
        if len.checked_mul(dtype_size(m.dtype)) != Some(m.data.len()) {
            return Err(CudaError::Invalid(format!(
                "a [{}, {}] {:?} matrix of {} bytes",
                m.rows,
                m.cols,
                m.dtype,
                m.data.len()
            )));
        }
        let data = match m.dtype {
            WeightDtype::F32 => WeightData::F32(upload_pod::<f32>(gpu, &m.data)?),
            WeightDtype::Bf16 => WeightData::Bf16(upload_pod::<u16>(gpu, &m.data)?),
            WeightDtype::F16 => WeightData::F16(upload_pod::<u16>(gpu, &m.data)?),
        };
        Ok(Self {
            data,
            rows: m.rows,
            cols: m.cols,
        })
    }
}

/// Little-endian bytes as elements of `T` on the device: in place when the host bytes are
/// aligned for `T` (a Vec's large allocations are), else through one aligned copy.
fn upload_pod<T: bytemuck::Pod>(gpu: &Gpu, bytes: &[u8]) -> CudaResult<DevBuf<T>> {
    match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(v) => gpu.upload(v),
        Err(_) => gpu.upload(&bytemuck::pod_collect_to_vec::<u8, T>(bytes)),
    }
}

/// The elements of a [`DevWeight`] (or of a KV cache layer): f32, or the raw 16-bit patterns
/// of bf16 / f16.
pub enum WeightData {
    F32(DevBuf<f32>),
    Bf16(DevBuf<u16>),
    F16(DevBuf<u16>),
}

impl WeightData {
    /// `len` zeroed elements of `dtype`.
    pub fn zeros(gpu: &Gpu, dtype: WeightDtype, len: usize) -> CudaResult<Self> {
        Ok(match dtype {
            WeightDtype::F32 => Self::F32(gpu.zeros(len)?),
            WeightDtype::Bf16 => Self::Bf16(gpu.zeros(len)?),
            WeightDtype::F16 => Self::F16(gpu.zeros(len)?),
        })
    }

    pub fn dtype(&self) -> WeightDtype {
        match self {
            Self::F32(_) => WeightDtype::F32,
            Self::Bf16(_) => WeightDtype::Bf16,
            Self::F16(_) => WeightDtype::F16,
        }
    }

    pub fn ptr(&self) -> u64 {
        match self {
            Self::F32(b) => b.ptr(),
            Self::Bf16(b) | Self::F16(b) => b.ptr(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::F32(b) => b.len(),
            Self::Bf16(b) | Self::F16(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    let g = GemmEx {
        transa: Op::T,
        transb: Op::N,
        m: n,
        n: mi,
        k,
        alpha: 1.0,
        a: w.data.ptr(),
        lda: k,
        b: x,
        ldb: k,
        ab_type: w.data.dtype(),
        beta: 0.0,
        c: y,
        ldc: n,
    };
    // SAFETY: `w` holds n × k elements; the caller passes `x` with m × k elements of the same
    // dtype and `y` with m × n f32 elements, all live device memory of this device. On the
    // compute stream, so the GEMM is ordered with the kernels around it.
    unsafe { gpu.dev.gemm_ex(Stream::Compute, &g) }
}

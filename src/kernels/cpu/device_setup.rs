//! Making a [`CpuDevice`] (its thread pool and bf16 path) and packing half-precision weights.

use std::sync::atomic::{AtomicBool, Ordering};

use super::CpuDevice;
use crate::kernels::cpu::bf16::{Bf16Kernel, Half, PackedHalf};
use crate::kernels::cpu::matmul::Weight;
use crate::kernels::device::HostMatrix;

impl CpuDevice {
    /// A device with `threads` compute threads (0 = every core), multiplying bf16 weights on
    /// `bf16` (`Auto`: the fastest path this CPU has; a path it lacks is an error).
    pub fn new(threads: usize, bf16: Bf16Kernel) -> Result<Self, String> {
        let bf16 = bf16.resolve()?;
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hsx-cpu-{i}"))
            .build()
            .map_err(|e| format!("cannot start {threads} threads: {e}"))?;
        Ok(Self {
            pool,
            threads,
            bf16,
            bf16_weights: AtomicBool::new(false),
            f16_weights: AtomicBool::new(false),
        })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The path bf16 weights are multiplied on.
    pub fn bf16_kernel(&self) -> Bf16Kernel {
        self.bf16
    }

    /// A checkpoint's `half` weight kept as such, in tiles, with the path that multiplies it
    /// (f16: [`Bf16Kernel::for_f16`]).
    pub(super) fn packed(&self, weight: &HostMatrix<'_>, half: Half) -> Weight {
        let (loaded, kernel) = match half {
            Half::Bf16 => (&self.bf16_weights, self.bf16),
            Half::F16 => (&self.f16_weights, self.bf16.for_f16()),
        };
        loaded.store(true, Ordering::Relaxed);
        let (n, k) = (weight.rows, weight.cols);
        let w = self
            .pool
            .install(|| match bytemuck::try_cast_slice::<u8, u16>(&weight.data) {
                Ok(bits) => PackedHalf::pack(bits, n, k, half),
                // Unaligned in the mapped file: one copy first.
                Err(_) => PackedHalf::pack(&bytemuck::pod_collect_to_vec(&weight.data), n, k, half),
            });
        Weight::Half { w, kernel }
    }

    /// What [`Device::describe`] says: the threads and the half-precision GEMM path.
    pub(super) fn description(&self) -> String {
        match self.f16_weights.load(Ordering::Relaxed) {
            true => format!(
                "cpu ({} threads, f16 GEMM: {})",
                self.threads,
                self.bf16.for_f16()
            ),
            false => {
                let emulated = if self.bf16.native() {
                    ""
                } else {
                    " on emulated tiles"
                };
                format!(
                    "cpu ({} threads, bf16 GEMM: {}{emulated})",
                    self.threads, self.bf16
                )
            }
        }
    }
}

//! `hsx env`: what hsx sees on this machine — the CPU features its kernels use, the bf16 path
//! `auto` picks, the thread count, and the CUDA device or why there is none. The first thing
//! to paste into a bug report.

use std::fmt::Write;

use crate::kernels::{Bf16Kernel, cuda};

/// The CPU features the CPU kernels dispatch on, each with whether this machine has it.
pub fn cpu_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        vec![
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("f16c", has!("f16c")),
            ("avx512f", has!("avx512f")),
            ("avx512bf16", has!("avx512bf16")),
            (
                "amx-bf16 (with the kernel's tile permission)",
                Bf16Kernel::Amx.native(),
            ),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    vec![]
}

/// The whole report, one `key: value` line each.
pub fn report() -> String {
    let mut out = String::new();
    let features: Vec<&str> = [
        cfg!(feature = "cuda").then_some("cuda"),
        cfg!(feature = "cuda-emu").then_some("cuda-emu"),
        cfg!(feature = "amx-emu").then_some("amx-emu"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let _ = writeln!(
        out,
        "hsx: {} (features: {})",
        crate::VERSION,
        join(&features)
    );
    let _ = writeln!(
        out,
        "cpu: {}",
        cpu_model().unwrap_or_else(|| "unknown".into())
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let _ = writeln!(out, "cpu threads (model.threads = 0): {cores}");
    for (name, present) in cpu_features() {
        let _ = writeln!(
            out,
            "cpu feature {name}: {}",
            if present { "yes" } else { "no" }
        );
    }
    let paths = Bf16Kernel::all_available();
    let auto = Bf16Kernel::Auto
        .resolve()
        .map_or_else(|e| e, |k| k.to_string());
    let _ = writeln!(out, "bf16 GEMM paths: {} (auto: {auto})", paths.join(", "));
    let f16 = Bf16Kernel::Auto.for_f16();
    let _ = writeln!(out, "f16 GEMM path (auto): {f16}");
    let _ = writeln!(out, "cuda libraries: {}", cuda::versions().describe());
    match cuda::probe(0) {
        Ok(d) => {
            let _ = writeln!(
                out,
                "cuda: {} device(s); device 0: {}, sm_{}{}, {:.1} GiB",
                d.device_count,
                d.name,
                d.compute_capability.0,
                d.compute_capability.1,
                d.total_memory as f64 / (1u64 << 30) as f64
            );
        }
        Err(why) => {
            let _ = writeln!(out, "cuda: not usable: {why}");
        }
    }
    out
}

fn join(items: &[&str]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_the_cpu_paths_and_cuda() {
        let r = super::report();
        for key in [
            "hsx: ",
            "cpu threads",
            "bf16 GEMM paths: ",
            "f16 GEMM path (auto): ",
            "cuda libraries: ",
            "cuda: ",
        ] {
            assert!(r.contains(key), "{key} missing from:\n{r}");
        }
        // The f32 path runs everywhere.
        assert!(r.contains("f32"), "{r}");
    }
}

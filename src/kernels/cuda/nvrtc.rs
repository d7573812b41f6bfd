//! NVRTC compilation of the embedded `.cu` sources, once per process and GPU architecture.
//!
//! Each source is compiled to a CUBIN for the device's exact `sm_XY` (a cubin loads on any
//! driver of the same major CUDA version; PTX from a newer NVRTC than the driver would be
//! refused), with [`COMMON`] prepended: no CUDA headers are needed at run time.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{result, sys};

/// The header prepended to every source: bf16/f16 types and conversions, reductions.
pub const COMMON: &str = include_str!("common.cuh");

/// Every kernel source: (module name, source). Add new `.cu` files here.
pub const SOURCES: &[(&str, &str)] = &[
    ("norm", include_str!("norm.cu")),
    ("rope", include_str!("rope.cu")),
    ("elementwise", include_str!("elementwise.cu")),
    ("embed", include_str!("embed.cu")),
    ("attention", include_str!("attention.cu")),
    ("capture", include_str!("capture.cu")),
    // Recurrent layers, MoE, the attention output gate and MLA's heads.
    ("conv1d", include_str!("conv1d.cu")),
    ("gated_delta", include_str!("gated_delta.cu")),
    ("mamba2", include_str!("mamba2.cu")),
    ("chunked", include_str!("chunked.cu")),
    ("chunked_mma", include_str!("chunked_mma.cu")),
    ("moe", include_str!("moe.cu")),
    ("moe_grouped", include_str!("moe_grouped.cu")),
    ("gated_attn", include_str!("gated_attn.cu")),
    ("mla", include_str!("mla.cu")),
    ("dsa", include_str!("dsa.cu")),
    ("hyper", include_str!("hyper.cu")),
];

/// The one tiny kernel the probe compiles and loads before anything else: an NVRTC that
/// cannot build for the device, or a driver that cannot load what it built, is then reported
/// at start with what to install, not as a failure of the first real module.
pub const PROBE_SOURCE: &str =
    "extern \"C\" __global__ void hsx_probe(float* x) { x[threadIdx.x] += 1.0f; }\n";

/// A compiled module image (CUBIN bytes).
pub type Image = Vec<u8>;

type Compiled = HashMap<(&'static str, (i32, i32)), Image>;

/// Compiled images, per (module, compute capability), for the life of the process.
fn cache() -> &'static Mutex<Compiled> {
    static CACHE: OnceLock<Mutex<Compiled>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// The CUBIN of module `name` for compute capability `cc`, compiled on first use.
pub fn image(name: &'static str, src: &str, cc: (i32, i32)) -> Result<Image, String> {
    // A poisoned lock only means another compile panicked; the map itself is never half-written.
    let mut cache = cache().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(img) = cache.get(&(name, cc)) {
        return Ok(img.clone());
    }
    let img = compile(name, src, cc)?;
    cache.insert((name, cc), img.clone());
    Ok(img)
}

/// Compiles one source (with [`COMMON`] prepended) to a CUBIN for `sm_{major}{minor}`.
pub fn compile(name: &str, src: &str, cc: (i32, i32)) -> Result<Image, String> {
    compile_with(name, src, cc, &[]).map(|(img, _)| img)
}

/// [`compile`] with extra NVRTC options; also returns the program log.
fn compile_with(
    name: &str,
    src: &str,
    cc: (i32, i32),
    extra: &[&str],
) -> Result<(Image, String), String> {
    if !nvrtc_present() {
        return Err("libnvrtc.so not found".into());
    }
    let full = format!("{COMMON}\n// ---- {name}.cu ----\n{src}");
    let csrc = CString::new(full).map_err(|_| format!("{name}.cu contains a NUL byte"))?;
    let cname = CString::new(format!("{name}.cu")).map_err(|e| e.to_string())?;
    let prog = result::create_program(&csrc, Some(&cname))
        .map_err(|e| format!("nvrtcCreateProgram({name}): {e:?}"))?;
    let out = build(prog, name, cc, extra);
    // SAFETY: `prog` was created above and is destroyed exactly once.
    if let Err(e) = unsafe { result::destroy_program(prog) } {
        tracing::warn!("nvrtcDestroyProgram({name}): {e:?}");
    }
    out
}

fn build(
    prog: sys::nvrtcProgram,
    name: &str,
    cc: (i32, i32),
    extra: &[&str],
) -> Result<(Image, String), String> {
    let mut options = vec![
        format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
        "--std=c++17".to_string(),
        // IEEE division and square root (the defaults, stated): results are compared with
        // the CPU backend.
        "--prec-div=true".to_string(),
        "--prec-sqrt=true".to_string(),
        "--ftz=false".to_string(),
    ];
    options.extend(extra.iter().map(|o| o.to_string()));
    // SAFETY: `prog` is a live program; the options outlive the call.
    if let Err(e) = unsafe { result::compile_program(prog, &options) } {
        let log = program_log(prog).unwrap_or_default();
        return Err(format!(
            "NVRTC failed to compile {name}.cu for sm_{}{} ({e:?}):\n{log}",
            cc.0, cc.1
        ));
    }
    let img = cubin(prog).map_err(|e| format!("nvrtcGetCUBIN({name}): {e}"))?;
    Ok((img, program_log(prog).unwrap_or_default()))
}

fn program_log(prog: sys::nvrtcProgram) -> Option<String> {
    // SAFETY: `prog` is live; the returned buffer is NUL-terminated by NVRTC.
    let raw = unsafe { result::get_program_log(prog) }.ok()?;
    let text = unsafe { CStr::from_ptr(raw.as_ptr() as *const c_char) };
    Some(text.to_string_lossy().into_owned())
}

fn cubin(prog: sys::nvrtcProgram) -> Result<Image, String> {
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| format!("{e:?}"))?;
    if size == 0 {
        return Err("empty CUBIN (compiled for a virtual architecture?)".into());
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(|e| format!("{e:?}"))?;
    Ok(buf)
}

/// Each module's compile result: the ptxas resource lines (`-v`) of its kernels, or the NVRTC
/// log.
pub type CompileReport = Vec<(&'static str, Result<Vec<KernelUsage>, String>)>;

/// What ptxas reports for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelUsage {
    pub kernel: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Static shared memory.
    pub smem_bytes: u32,
}

/// The kernels' usage from a ptxas `-v` log: a `Compiling entry function 'NAME'` line, then
/// `N bytes stack frame, N bytes spill stores, N bytes spill loads` and
/// `Used N registers, ... N bytes smem ...`.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelUsage> {
    let mut out: Vec<KernelUsage> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let kernel = rest.split('\'').next().unwrap_or("").to_string();
            out.push(KernelUsage {
                kernel,
                ..KernelUsage::default()
            });
            continue;
        }
        let Some(k) = out.last_mut() else { continue };
        for part in line.split([',', ':']) {
            let words: Vec<&str> = part.split_whitespace().collect();
            let num = |i: usize| words.get(i).and_then(|w| w.parse::<u32>().ok());
            match words.as_slice() {
                ["Used", _, "registers", ..] => k.registers = num(1).unwrap_or(0),
                [_, "bytes", "spill", "stores"] => k.spill_stores = num(0).unwrap_or(0),
                [_, "bytes", "spill", "loads"] => k.spill_loads = num(0).unwrap_or(0),
                [_, "bytes", "smem"] => k.smem_bytes = num(0).unwrap_or(0),
                _ => {}
            }
        }
    }
    out
}

/// Compiles every source for `cc` without a GPU (the NVRTC test), with ptxas's resource report:
/// `Err` says why it could not run (no libnvrtc), `Ok` holds each module's result.
pub fn compile_all_for_test(cc: (i32, i32)) -> Result<CompileReport, String> {
    if !nvrtc_present() {
        return Err(
            "libnvrtc.so not found (set LD_LIBRARY_PATH to a CUDA 13 lib directory)".into(),
        );
    }
    Ok(SOURCES
        .iter()
        .map(|&(name, src)| {
            let r = compile_with(name, src, cc, &["--ptxas-options=-v"]);
            (name, r.map(|(_, log)| parse_ptxas_log(&log)))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every source compiles for the GPUs hsx targets (A100, H100/H200). Needs only libnvrtc
    /// (no GPU, no driver); skipped, saying so, where it is absent.
    #[test]
    fn every_kernel_source_compiles_with_nvrtc() {
        for cc in [(9, 0), (8, 0)] {
            let results = match compile_all_for_test(cc) {
                Ok(r) => r,
                // CI installs the NVRTC wheel and sets HSX_REQUIRE_NVRTC: no skip there.
                Err(reason) if std::env::var_os("HSX_REQUIRE_NVRTC").is_some() => {
                    panic!("HSX_REQUIRE_NVRTC is set: {reason}")
                }
                Err(reason) => {
                    eprintln!("skipping: {reason}");
                    return;
                }
            };
            for (name, r) in &results {
                let usage = match r {
                    Ok(u) => u,
                    Err(e) => panic!("{name}.cu does not compile:\n{e}"),
                };
                assert!(!usage.is_empty(), "{name}.cu: no ptxas report");
                for k in usage {
                    eprintln!(
                        "sm_{}{} {name}.cu {}: {} registers, {} B spill stores, {} B spill loads, {} B static smem",
                        cc.0,
                        cc.1,
                        k.kernel,
                        k.registers,
                        k.spill_stores,
                        k.spill_loads,
                        k.smem_bytes
                    );
                    assert!(
                        k.spill_stores == 0 && k.spill_loads == 0,
                        "{}: register spills on sm_{}{}",
                        k.kernel,
                        cc.0,
                        cc.1
                    );
                    // Only attention takes dynamic shared memory, at most SMEM_LIMIT: static +
                    // dynamic must stay within 48 KiB, no kernel sets the opt-in attribute.
                    let dynamic = match k.kernel.starts_with("attention_") {
                        true => super::super::kv_cache::SMEM_LIMIT,
                        false => 0,
                    };
                    assert!(
                        k.smem_bytes as usize + dynamic <= 48 * 1024,
                        "{}: {} B static + {dynamic} B dynamic shared memory over 48 KiB",
                        k.kernel,
                        k.smem_bytes
                    );
                }
            }
            assert_eq!(results.len(), SOURCES.len());
            compile("probe", PROBE_SOURCE, cc).expect("the probe's kernel compiles");
        }
    }

    /// Every name the launchers use is an entry point of some source.
    #[test]
    fn launched_kernels_exist() {
        let all: Vec<String> = SOURCES
            .iter()
            .flat_map(|(_, src)| super::super::context::kernel_names_for_test(src))
            .collect();
        let mut wanted = vec![
            "head_norm".to_string(),
            "rope".into(),
            "bias_add".into(),
            "add_f32".into(),
            "cast_f32_bf16".into(),
            "cast_f32_f16".into(),
            "gather_rows".into(),
            "argmax_rows".into(),
        ];
        for d in ["f32", "bf16", "f16"] {
            for k in [
                "rms_norm",
                "add_rms_norm",
                "layer_norm",
                "add_layer_norm",
                "layer_norm_bias",
                "add_layer_norm_bias",
                "silu_mul",
                "swiglu_clamped",
                "gelu_tanh_mul",
                "gelu_tanh",
                "gelu_erf",
                "embed",
                "kv_write",
                "gate",
                "capture_rows",
                "scale",
                "clamp",
            ] {
                wanted.push(format!("{k}_{d}"));
            }
        }
        for (c, o) in [
            ("f32", "f32"),
            ("bf16", "bf16"),
            ("bf16", "f32"),
            ("f16", "f16"),
            ("f16", "f32"),
        ] {
            wanted.push(format!("attention_{c}_{o}"));
            wanted.push(format!("attention_wide_{c}_{o}"));
        }
        for hd in [16, 32, 64, 128] {
            for o in ["bf16", "f32"] {
                wanted.push(format!("attn_mma_h{hd}_{o}"));
            }
        }
        for w in &wanted {
            assert!(all.contains(w), "kernel {w} missing from the sources");
        }
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len(), "duplicate kernel names: {all:?}");
    }

    #[test]
    fn ptxas_reports_are_read() {
        let log = "ptxas info    : Compiling entry function 'rms_norm_f32' for 'sm_90'\n\
                   ptxas info    : Function properties for rms_norm_f32\n\
                   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 30 registers, 256 bytes smem, 400 bytes cmem[0]\n\
                   ptxas info    : Compiling entry function 'rope' for 'sm_90'\n\
                   ptxas info    : Used 12 registers, 392 bytes cmem[0]\n";
        let u = parse_ptxas_log(log);
        assert_eq!(u.len(), 2, "{u:?}");
        assert_eq!(
            (
                u[0].registers,
                u[0].spill_stores,
                u[0].spill_loads,
                u[0].smem_bytes
            ),
            (30, 4, 12, 256)
        );
        assert_eq!(
            (u[1].kernel.as_str(), u[1].registers, u[1].smem_bytes),
            ("rope", 12, 0)
        );
    }

    #[test]
    fn kernel_names_are_found() {
        let names = super::super::context::kernel_names_for_test(include_str!("attention.cu"));
        assert!(names.iter().any(|n| n == "kv_write_bf16"), "{names:?}");
        assert!(names.iter().any(|n| n == "attention_bf16_f32"), "{names:?}");
        assert!(names.iter().any(|n| n == "attn_mma_h128_bf16"), "{names:?}");
        assert!(names.iter().any(|n| n == "attn_mma_h256_f32"), "{names:?}");
        assert!(
            names.iter().any(|n| n == "attention_wide_bf16_f32"),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n == "NAME"), "{names:?}");
        assert_eq!(names.len(), 3 + 2 * 5 + 10, "{names:?}");
    }
}

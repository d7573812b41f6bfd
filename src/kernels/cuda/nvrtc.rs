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
    // Recurrent layers, MoE and the attention output gate.
    ("conv1d", include_str!("conv1d.cu")),
    ("gated_delta", include_str!("gated_delta.cu")),
    ("mamba2", include_str!("mamba2.cu")),
    ("moe", include_str!("moe.cu")),
    ("gated_attn", include_str!("gated_attn.cu")),
];

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
    if !nvrtc_present() {
        return Err("libnvrtc.so not found".into());
    }
    let full = format!("{COMMON}\n// ---- {name}.cu ----\n{src}");
    let csrc = CString::new(full).map_err(|_| format!("{name}.cu contains a NUL byte"))?;
    let cname = CString::new(format!("{name}.cu")).map_err(|e| e.to_string())?;
    let prog = result::create_program(&csrc, Some(&cname))
        .map_err(|e| format!("nvrtcCreateProgram({name}): {e:?}"))?;
    let out = build(prog, name, cc);
    // SAFETY: `prog` was created above and is destroyed exactly once.
    if let Err(e) = unsafe { result::destroy_program(prog) } {
        tracing::warn!("nvrtcDestroyProgram({name}): {e:?}");
    }
    out
}

fn build(prog: sys::nvrtcProgram, name: &str, cc: (i32, i32)) -> Result<Image, String> {
    let options = [
        format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
        "--std=c++17".to_string(),
        // IEEE division and square root (the defaults, stated): results are compared with
        // the CPU backend.
        "--prec-div=true".to_string(),
        "--prec-sqrt=true".to_string(),
        "--ftz=false".to_string(),
    ];
    // SAFETY: `prog` is a live program; the options outlive the call.
    if let Err(e) = unsafe { result::compile_program(prog, &options) } {
        let log = program_log(prog).unwrap_or_default();
        return Err(format!(
            "NVRTC failed to compile {name}.cu for sm_{}{} ({e:?}):\n{log}",
            cc.0, cc.1
        ));
    }
    cubin(prog).map_err(|e| format!("nvrtcGetCUBIN({name}): {e}"))
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

/// Each module's compile result: CUBIN size, or the NVRTC log.
pub type CompileReport = Vec<(&'static str, Result<usize, String>)>;

/// Compiles every source for `cc` without a GPU (the NVRTC test): `Err` says why it could not
/// run (no libnvrtc), `Ok` holds each module's compile result.
pub fn compile_all_for_test(cc: (i32, i32)) -> Result<CompileReport, String> {
    if !nvrtc_present() {
        return Err(
            "libnvrtc.so not found (set LD_LIBRARY_PATH to a CUDA 13 lib directory)".into(),
        );
    }
    Ok(SOURCES
        .iter()
        .map(|&(name, src)| (name, compile(name, src, cc).map(|img| img.len())))
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
                Err(reason) => {
                    eprintln!("skipping: {reason}");
                    return;
                }
            };
            for (name, r) in &results {
                match r {
                    Ok(bytes) => eprintln!("{name}.cu: sm_{}{} cubin, {bytes} bytes", cc.0, cc.1),
                    Err(e) => panic!("{name}.cu does not compile:\n{e}"),
                }
            }
            assert_eq!(results.len(), SOURCES.len());
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
            "head_rms_norm".to_string(),
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
                "silu_mul",
                "embed",
                "kv_write",
                "attn_gate",
                "capture_rows",
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
    fn kernel_names_are_found() {
        let names = super::super::context::kernel_names_for_test(include_str!("attention.cu"));
        assert!(names.iter().any(|n| n == "kv_write_bf16"), "{names:?}");
        assert!(names.iter().any(|n| n == "attention_bf16_f32"), "{names:?}");
        assert!(!names.iter().any(|n| n == "NAME"), "{names:?}");
        assert_eq!(names.len(), 3 + 5, "{names:?}");
    }
}

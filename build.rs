//! With the `cuda` or `cuda-emu` feature: every kernel's parameter kinds from its `extern "C"`
//! signature (`$OUT_DIR/kernel_sigs.rs`, what `launch!` checks its arguments against at
//! compile time). With `cuda-emu` also: compiles the CUDA kernels (src/kernels/cuda/*.cu, with
//! common.cuh prepended as NVRTC does) for the host with g++ and the emulation header
//! src/kernels/cuda/emu/cuda_emu.h, one C++ trampoline per `__global__` entry point (it unpacks
//! the cuLaunchKernel argument array by the kernel's own signature), and a Rust table of them by
//! name (`$OUT_DIR/emu_kernels.rs`). `HSX_EMU_ASAN=1` builds them with AddressSanitizer.
//! Without the feature it does nothing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

const KERNEL_DIR: &str = "src/kernels/cuda";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let emu = env::var_os("CARGO_FEATURE_CUDA_EMU").is_some();
    if !emu && env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed={KERNEL_DIR}");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let common = read(&Path::new(KERNEL_DIR).join("common.cuh"));
    let mut modules = Vec::new();
    for (module, src) in kernel_sources() {
        let entries = entry_points(&out, &module, &format!("{common}\n{src}"));
        modules.push((module, src, entries));
    }
    let all: Vec<&Entry> = modules.iter().flat_map(|m| &m.2).collect();
    fs::write(out.join("kernel_sigs.rs"), sig_table(&all)).expect("write signatures");
    if emu {
        build_emulator(&out, &common, &modules);
    }
}

/// One `__global__` entry point: its name and its parameters' kinds.
struct Entry {
    name: String,
    kinds: Vec<&'static str>,
}

/// Compiles the emulated kernels and writes their Rust table.
fn build_emulator(out: &Path, common: &str, modules: &[(String, String, Vec<Entry>)]) {
    println!("cargo:rerun-if-changed={KERNEL_DIR}/emu");
    println!("cargo:rerun-if-env-changed=HSX_EMU_ASAN");
    let mut units = Vec::new();
    let mut kernels = Vec::new();
    for (module, src, entries) in modules {
        let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        let unit = out.join(format!("emu_{module}.cpp"));
        fs::write(&unit, emulated_unit(module, common, src, &names)).expect("write unit");
        units.push(unit);
        kernels.extend(names);
    }
    let asan = env::var("HSX_EMU_ASAN").is_ok_and(|v| v == "1");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .include(Path::new(KERNEL_DIR).join("emu"))
        .include(KERNEL_DIR)
        // __fmul_rn & co. are single IEEE operations that must never be fused into an FMA.
        .flag("-ffp-contract=off")
        .flag("-fno-fast-math")
        .warnings(false)
        .file(Path::new(KERNEL_DIR).join("emu/runtime.cpp"))
        .file(Path::new(KERNEL_DIR).join("emu/scheduler_probe.cpp"))
        .files(&units);
    if asan {
        build
            .flag("-fsanitize=address")
            .flag("-fno-omit-frame-pointer");
        println!("cargo:rustc-link-lib=dylib=asan");
    }
    build.compile("hsx_cuda_emu");
    fs::write(out.join("emu_kernels.rs"), rust_table(&kernels)).expect("write table");
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `NAME.cu` of the kernel directory, sorted by name.
fn kernel_sources() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = fs::read_dir(KERNEL_DIR)
        .expect("kernel dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, read(&p))
        })
        .collect();
    v.sort();
    v
}

/// The `__global__` entry points of `text` after the C preprocessor (so macro-made kernels
/// such as `HSX_ATTN(...)` count), in order.
fn entry_points(out: &Path, module: &str, text: &str) -> Vec<Entry> {
    let path = out.join(format!("sig_{module}.cpp"));
    fs::write(&path, text).expect("write");
    let expanded = cc::Build::new()
        .cpp(true)
        .file(&path)
        .flag("-P")
        .cargo_metadata(false)
        .warnings(false)
        .expand();
    let expanded = String::from_utf8_lossy(&expanded);
    const DECL: &str = "__global__ void ";
    let mut names = Vec::new();
    let mut rest: &str = &expanded;
    while let Some(i) = rest.find(DECL) {
        rest = &rest[i + DECL.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let params = rest[name.len()..]
            .trim_start()
            .strip_prefix('(')
            .and_then(|p| p.split_once(')'))
            .map(|(p, _)| p)
            .unwrap_or_else(|| panic!("{module}.cu: kernel {name}: no parameter list"));
        let kinds = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "void")
            .map(|p| {
                param_kind(p).unwrap_or_else(|| panic!("{module}.cu: {name}: parameter `{p}`"))
            })
            .collect();
        names.push(Entry { name, kinds });
    }
    names
}

/// The Rust `ArgKind` of one C parameter declaration (`const float* __restrict__ x`, `int n`).
fn param_kind(decl: &str) -> Option<&'static str> {
    if decl.contains('*') {
        return Some("Ptr");
    }
    // The declaration without its name and qualifiers.
    let words: Vec<&str> = decl
        .split_whitespace()
        .filter(|w| *w != "const" && *w != "__restrict__")
        .collect();
    let ty = words[..words.len().checked_sub(1)?].join(" ");
    Some(match ty.as_str() {
        "int" => "I32",
        "unsigned" | "unsigned int" => "U32",
        "long long" => "I64",
        "unsigned long long" => "U64",
        "float" => "F32",
        "double" => "F64",
        "AttnArgs" => "Attn",
        _ => return None,
    })
}

/// `KERNEL_SIGS`: every entry point's name and parameter kinds, in source order.
fn sig_table(entries: &[&Entry]) -> String {
    let mut s = String::from(
        "/// Every kernel's name and parameter kinds, from its `extern \"C\"` signature (build.rs).\n\
         pub const KERNEL_SIGS: &[(&str, &[ArgKind])] = &[\n",
    );
    for e in entries {
        let kinds: Vec<String> = e.kinds.iter().map(|k| format!("ArgKind::{k}")).collect();
        let _ = writeln!(s, "    (\"{}\", &[{}]),", e.name, kinds.join(", "));
    }
    s.push_str("];\n");
    s
}

/// The host translation unit of one module: common.cuh and the source inside a namespace of
/// its own (as NVRTC compiles each module alone), then one trampoline per entry point.
fn emulated_unit(module: &str, common: &str, src: &str, names: &[String]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#include \"cuda_emu.h\"\nnamespace hsx_mod_{module} {{");
    let _ = writeln!(
        s,
        "#line 1 \"{KERNEL_DIR}/common.cuh\"\n{}",
        host_source(common)
    );
    let _ = writeln!(
        s,
        "#line 1 \"{KERNEL_DIR}/{module}.cu\"\n{}",
        host_source(src)
    );
    let _ = writeln!(s, "}}  // namespace hsx_mod_{module}");
    for n in names {
        let _ = writeln!(
            s,
            "extern \"C\" int hsx_emu_k_{n}(const hsx_emu::Launch* l, void** p, int np, \
             const unsigned* sizes) {{ return hsx_emu::run(l, p, np, sizes, &hsx_mod_{module}::{n}); }}"
        );
    }
    s
}

/// The two source changes the host build needs: entry points get C++ linkage inside their
/// module's namespace, and `extern __shared__ T name[];` becomes a pointer to the launch's
/// dynamic shared memory.
fn host_source(src: &str) -> String {
    let src = src.replace("extern \"C\" __global__", "__global__");
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        match dynamic_shared(line) {
            Some((ty, name)) => {
                let _ = writeln!(
                    out,
                    "{ty}* {name} = static_cast<{ty}*>(hsx_emu::dyn_shared());"
                );
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// (`T`, `name`) of a line `extern __shared__ [alignas(..)] T name[];`.
fn dynamic_shared(line: &str) -> Option<(String, String)> {
    let rest = line.trim().strip_prefix("extern __shared__ ")?;
    let rest = rest.strip_suffix("[];")?;
    let rest = match rest.strip_prefix("alignas(") {
        Some(r) => r.split_once(')')?.1.trim(),
        None => rest,
    };
    let (ty, name) = rest.rsplit_once(' ')?;
    Some((ty.trim().to_string(), name.trim().to_string()))
}

/// The Rust side: the trampolines' declarations and a table by kernel name.
fn rust_table(kernels: &[String]) -> String {
    let mut s = String::from("unsafe extern \"C\" {\n");
    for n in kernels {
        let _ = writeln!(
            s,
            "    fn hsx_emu_k_{n}(l: *const EmuLaunch, p: *mut *mut c_void, np: i32, sizes: *const u32) -> i32;"
        );
    }
    s.push_str("}\n\n/// Every emulated kernel by its `extern \"C\"` name.\npub(super) static KERNELS: &[(&str, EmuKernel)] = &[\n");
    for n in kernels {
        let _ = writeln!(s, "    (\"{n}\", hsx_emu_k_{n}),");
    }
    s.push_str("];\n");
    s
}

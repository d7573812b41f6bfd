//! The `config.json` of released checkpoints (tests/fixtures/released_configs/, sources in its
//! README) parsed the way the engine does before it opens any weight: each is accepted with
//! the right architecture and layer pattern. Also: an unknown
//! architecture is refused with the supported list, and a supported architecture with an
//! option hsx does not run names the option.

use std::path::{Path, PathBuf};

use hsx::models::{LayerKind, ModelSpec, pyjson};

/// What hsx makes of one released config today.
enum Expect {
    /// Architecture (`architectures[0]` as hsx reports it), layer count, and for hybrid models
    /// the layer pattern (`*` attention, `G` Gated DeltaNet, `M` Mamba-2, `-` MLP, `E` MoE).
    Accepted(&'static str, usize, Option<&'static str>),
}
use Expect::Accepted;

/// Qwen3.5 / Qwen3-Next layout with `full_attention_interval` 4.
const GGG_STAR: &str = "GGG*";
/// Nemotron 3 Nano 30B-A3B's `hybrid_override_pattern`.
const NANO: &str = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";

/// Granite-4.0-H-Small / Tiny / Micro / 1B: attention every 10th layer from layer 5.
const GRANITE_H: &str = "MMMMM*MMMMMMMMM*MMMMMMMMM*MMMMMMMMM*MMMM";
/// Bamba-9B's `attn_layer_indices` [9, 18, 27].
const BAMBA_9B: &str = "MMMMMMMMM*MMMMMMMM*MMMMMMMM*MMMM";
/// Granite-4.0-H-350M's layer types.
const GRANITE_350M: &str = "MMMMMMMMMM*MM*MMM*MMMMMMMMM*MMMM";

const CASES: &[(&str, Expect)] = &[
    ("llama-3.1-8b.json", Accepted("LlamaForCausalLM", 32, None)),
    // Every layer attends to a window of 4096 keys.
    (
        "mistral-7b-instruct-v0.1.json",
        Accepted("MistralForCausalLM", 32, None),
    ),
    ("qwen3-8b.json", Accepted("Qwen3ForCausalLM", 36, None)),
    // Llama's layers with q / k / v biases, o_proj unbiased.
    (
        "seed-oss-36b-instruct.json",
        Accepted("SeedOssForCausalLM", 64, None),
    ),
    // Llama's layers, every 4th without RoPE.
    (
        "smollm3-3b-base.json",
        Accepted("SmolLM3ForCausalLM", 36, None),
    ),
    (
        "qwen3-30b-a3b.json",
        Accepted("Qwen3MoeForCausalLM", 48, Some("*")),
    ),
    (
        "qwen3-235b-a22b-instruct-2507.json",
        Accepted("Qwen3MoeForCausalLM", 94, Some("*")),
    ),
    (
        "qwen3.6-27b.json",
        Accepted("Qwen3_5ForCausalLM", 64, Some(GGG_STAR)),
    ),
    (
        "qwen3.5-35b-a3b.json",
        Accepted("Qwen3_5MoeForCausalLM", 40, Some(GGG_STAR)),
    ),
    (
        "qwen3-next-80b-a3b-instruct.json",
        Accepted("Qwen3NextForCausalLM", 48, Some(GGG_STAR)),
    ),
    (
        "nemotron-3-nano-30b-a3b.json",
        Accepted("NemotronHForCausalLM", 52, Some(NANO)),
    ),
    // MXFP4 experts, dequantised at load.
    ("gpt-oss-20b.json", Accepted("GptOssForCausalLM", 24, None)),
    ("gpt-oss-120b.json", Accepted("GptOssForCausalLM", 36, None)),
    (
        "mixtral-8x7b-v0.1.json",
        Accepted("MixtralForCausalLM", 32, Some("*")),
    ),
    // Its multi-token-prediction layer (layer 46 on disk) is not a decoder layer.
    (
        "glm-4.5-air.json",
        Accepted("Glm4MoeForCausalLM", 46, Some("*")),
    ),
    // Multi-head latent attention, block-quantized FP8 weights (dequantized at load).
    (
        "deepseek-v3.json",
        Accepted("DeepseekV3ForCausalLM", 61, Some("*")),
    ),
    // Multi-head latent attention (q through its LoRA), DeepSeek-V2's group-limited router.
    (
        "deepseek-v2.5.json",
        Accepted("DeepseekV2ForCausalLM", 60, Some("*")),
    ),
    // Multi-head latent attention; its MTP layer (47 on disk) is not a decoder layer either.
    (
        "glm-4.7-flash.json",
        Accepted("Glm4MoeLiteForCausalLM", 47, Some("*")),
    ),
    // q/k norm over whole projections, rotary_dim 64 of 128, FP8 (`fmt` float8_e4m3fn).
    (
        "minimax-m2.5.json",
        Accepted("MiniMaxM2ForCausalLM", 62, Some("*")),
    ),
    // Its language model, text-only (MRoPE over t = h = w positions is plain RoPE).
    (
        "qwen3-vl-30b-a3b-instruct.json",
        Accepted("Qwen3MoeForCausalLM", 48, Some("*")),
    ),
    // Its language model, text-only: every 4th layer NoPE, the others chunked (8192).
    (
        "llama-4-scout-17b-16e.json",
        Accepted("Llama4ForCausalLM", 48, Some("*")),
    ),
    // Every second layer full attention, the others a window of 4096; scores soft-capped at 50.
    // Biased projections and LayerNorms, a window of 4096 keys on every layer.
    (
        "starcoder2-3b.json",
        Accepted("Starcoder2ForCausalLM", 30, None),
    ),
    (
        "starcoder2-15b.json",
        Accepted("Starcoder2ForCausalLM", 40, None),
    ),
    ("gemma-2-9b.json", Accepted("Gemma2ForCausalLM", 42, None)),
    ("gemma-2-27b.json", Accepted("Gemma2ForCausalLM", 46, None)),
    // Every 6th layer full attention, the others a window of 512 (1B) or 1024 keys.
    (
        "gemma-3-1b-it.json",
        Accepted("Gemma3ForCausalLM", 26, None),
    ),
    // Their language models, text-only; the text configs name only what differs from the class.
    (
        "gemma-3-4b-it.json",
        Accepted("Gemma3ForCausalLM", 34, None),
    ),
    (
        "gemma-3-27b-it.json",
        Accepted("Gemma3ForCausalLM", 62, None),
    ),
    // Its language model, text-only: every 6th layer full (4 KV heads of 512, values from the
    // keys' projection), the others a window of 1024 keys (16 KV heads of 256).
    (
        "gemma-4-31b-it.json",
        Accepted("Gemma4ForCausalLM", 60, None),
    ),
    // Its language model, text-only: Mistral's layers, no window, head_dim 128.
    (
        "mistral-small-3.1-24b-instruct-2503.json",
        Accepted("MistralForCausalLM", 40, None),
    ),
    // Llama's layers with the multipliers.
    (
        "granite-3.3-8b-instruct.json",
        Accepted("GraniteForCausalLM", 40, None),
    ),
    // Attention (NoPE) at 10, 13, 17, 27; the shared MLP alone.
    (
        "granite-4.0-h-350m.json",
        Accepted("GraniteMoeHybridForCausalLM", 32, Some(GRANITE_350M)),
    ),
    (
        "granite-4.0-h-micro.json",
        Accepted("GraniteMoeHybridForCausalLM", 40, Some(GRANITE_H)),
    ),
    // Llama's layers with fused projections.
    ("phi-4.json", Accepted("Phi3ForCausalLM", 40, None)),
    // LongRoPE (`su`), on its short factors: up to 4096 positions.
    (
        "phi-3-vision-128k-text.json",
        Accepted("Phi3ForCausalLM", 32, None),
    ),
    // Attention at attn_layer_indices 9, 18, 27.
    (
        "bamba-9b.json",
        Accepted("BambaForCausalLM", 32, Some(BAMBA_9B)),
    ),
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/released_configs")
}

/// `config.json` text -> spec, as `ModelSpec::from_dir` reads it (Python's JSON numbers
/// included) but without asking the weights for a dtype.
fn parse(path: &Path) -> Result<ModelSpec, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let value = pyjson::from_str(&text).map_err(|e| e.to_string())?;
    ModelSpec::from_json(&value, path, "released".into()).map_err(|e| e.to_string())
}

fn pattern(spec: &ModelSpec) -> Option<String> {
    let h = spec.hybrid.as_ref()?;
    let kind = |k: &LayerKind| match k {
        LayerKind::Attention => '*',
        LayerKind::GatedDeltaNet => 'G',
        LayerKind::KimiDelta => 'K',
        LayerKind::Mamba1 => 'm',
        LayerKind::Mamba2 => 'M',
        LayerKind::Mlp => '-',
        LayerKind::Moe => 'E',
        LayerKind::MambaAttention => 'H',
        LayerKind::ShortConv => 'C',
    };
    Some(h.layers.iter().map(kind).collect())
}

/// `Some(why)` when `got` is not what `want` says.
fn mismatch(got: &Result<ModelSpec, String>, want: &Expect) -> Option<String> {
    match (got, want) {
        (Ok(s), Accepted(arch, layers, pat)) => {
            let p = pattern(s);
            // A repeating pattern is given by its period.
            let pat_ok = match (pat, &p) {
                (None, None) => true,
                (Some(w), Some(g)) => g.as_bytes().chunks(w.len()).all(|c| c == w.as_bytes()),
                _ => false,
            };
            let ok = s.architecture.hf_name() == *arch && s.num_layers == *layers && pat_ok;
            (!ok).then(|| {
                format!(
                    "accepted as {} with {} layers, pattern {p:?}",
                    s.architecture.hf_name(),
                    s.num_layers
                )
            })
        }
        (Err(e), Accepted(..)) => Some(format!("refused: {e}")),
    }
}

#[test]
fn released_configs_parse_as_expected() {
    let mut listed: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    listed.sort_unstable();
    let mut files: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    files.sort_unstable();
    assert_eq!(
        files, listed,
        "every released config has exactly one line in CASES"
    );
    let failures: Vec<String> = CASES
        .iter()
        .filter_map(|(file, want)| {
            let got = parse(&dir().join(file));
            match &got {
                Ok(s) => eprintln!(
                    "{file}: {} ({} layers)",
                    s.architecture.hf_name(),
                    s.num_layers
                ),
                Err(e) => eprintln!("{file}: {e}"),
            }
            mismatch(&got, want).map(|why| format!("{file}: {why}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A released config with one change.
fn edited(file: &str, edit: impl Fn(&mut serde_json::Value)) -> Result<ModelSpec, String> {
    let path = dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut value = pyjson::from_str(&text).unwrap();
    edit(&mut value);
    ModelSpec::from_json(&value, &path, "edited".into()).map_err(|e| e.to_string())
}

/// An unknown architecture is refused with the supported list, and that list is exact: each
/// name on it is accepted (a released config under that name fails later, if at all, on
/// something else), and each architecture a released config is accepted as is on it.
#[test]
fn unknown_architecture_names_the_supported_ones() {
    let e = edited("llama-3.1-8b.json", |c| {
        c["architectures"] = serde_json::json!(["FooForCausalLM"])
    })
    .unwrap_err();
    assert!(
        e.contains("unsupported architecture `FooForCausalLM`"),
        "{e}"
    );
    let list = e
        .split("(supported: ")
        .nth(1)
        .and_then(|l| l.strip_suffix(')'))
        .unwrap();
    let supported: Vec<&str> = list.split(", ").collect();
    assert!(supported.len() >= 7, "{e}");
    for name in &supported {
        let got = edited("llama-3.1-8b.json", |c| {
            c["architectures"] = serde_json::json!([name])
        });
        if let Err(e) = got {
            assert!(
                !e.contains("unsupported architecture"),
                "{name} is listed but refused: {e}"
            );
        }
    }
    for (file, Accepted(arch, ..)) in CASES {
        assert!(
            supported.contains(arch),
            "{file}: {arch} missing from `{e}`"
        );
    }
}

/// A supported architecture with an option hsx does not run: the message names the option.
#[test]
fn unsupported_options_name_the_option() {
    use serde_json::json;
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 10] = [
        (
            "llama-3.1-8b.json",
            |c| c["hidden_act"] = json!("gelu"),
            "hidden_act",
        ),
        (
            "llama-3.1-8b.json",
            |c| c["rope_scaling"]["rope_type"] = json!("longrope"),
            "longrope",
        ),
        (
            "qwen3-8b.json",
            |c| c["quantization_config"] = json!({"quant_method": "awq", "bits": 4}),
            "quant_method `awq`",
        ),
        (
            "qwen3-8b.json",
            |c| c["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e5m2"}),
            "quantization_config.fmt",
        ),
        (
            "qwen3-8b.json",
            |c| (c["use_sliding_window"], c["sliding_window"]) = (json!(true), json!(4096)),
            "sliding_window 4096",
        ),
        (
            "qwen3-next-80b-a3b-instruct.json",
            |c| c["hidden_act"] = json!("gelu"),
            "hidden_act `gelu`",
        ),
        (
            "nemotron-3-nano-30b-a3b.json",
            |c| c["n_group"] = json!(3),
            "`n_group`: 128 experts do not split into 3 groups",
        ),
        (
            "nemotron-3-nano-30b-a3b.json",
            |c| c["moe_latent_size"] = json!(4096),
            "`moe_latent_size`: 4096",
        ),
        (
            "nemotron-3-nano-30b-a3b.json",
            |c| c["mlp_hidden_act"] = json!("silu"),
            "mlp_hidden_act `silu`",
        ),
        (
            "nemotron-3-nano-30b-a3b.json",
            |c| c["hybrid_override_pattern"] = json!("M*X"),
            "block `X`",
        ),
    ];
    for (file, edit, want) in cases {
        match edited(file, edit) {
            Ok(_) => panic!("{file} with `{want}` accepted"),
            Err(e) => assert!(e.contains(want), "{file}: `{e}` should name `{want}`"),
        }
    }
}

/// Nemotron 3 Nano fits the CUDA router; a grouping past its limits is refused when the model
/// is loaded onto CUDA (before any forward), naming the fields.
#[test]
fn cuda_router_limits_are_checked_at_load() {
    use hsx::models::devices::cuda_unsupported;
    let nano = edited("nemotron-3-nano-30b-a3b.json", |_| {}).unwrap();
    assert_eq!(cuda_unsupported(&nano), None);
    let wide = edited("nemotron-3-nano-30b-a3b.json", |c| {
        (c["n_routed_experts"], c["n_group"], c["topk_group"]) = (256.into(), 64.into(), 2.into());
    })
    .unwrap();
    let why = cuda_unsupported(&wide).unwrap();
    assert!(why.contains("n_routed_experts 256 in n_group 64"), "{why}");
}

/// Gemma 4-31B's full layers have heads of 512: the CUDA attention's wide kernel takes them;
/// wider ones are refused on CUDA by name (the CPU runs them).
#[test]
fn gemma4_wide_heads_run_on_cuda_up_to_512() {
    use hsx::models::devices::cuda_unsupported;
    let g = edited("gemma-4-31b-it.json", |_| {}).unwrap();
    assert_eq!(cuda_unsupported(&g), None);
    let wider = edited("gemma-4-31b-it.json", |c| {
        c["text_config"]["global_head_dim"] = 1024.into();
    })
    .unwrap();
    let why = cuda_unsupported(&wider).unwrap();
    assert!(why.contains("head_dim 1024 > 512"), "{why}");
}

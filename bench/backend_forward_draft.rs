//! Throughput of the CPU backend on a synthetic Llama-shaped model (random weights).
//! Ignored by default; run with
//! `cargo test --release --test models_bench -- --ignored --nocapture`
//! (env: HSX_BENCH_HIDDEN, HSX_BENCH_LAYERS, HSX_BENCH_THREADS, HSX_BENCH_TOKENS).

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use hsx::kernels::cpu::{CpuBackend, CpuOptions};
use hsx::kernels::{Backend, Batch, SeqChunk};
use hsx::models::ModelSpec;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Writes `config.json` + a bf16 `model.safetensors` with uniform random weights.
fn write_model(dir: &Path, hidden: usize, layers: usize, inter: usize, vocab: usize) {
    let heads = hidden / 64;
    let kv = (heads / 4).max(1);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "vocab_size": vocab, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "dtype": "bfloat16", "tie_word_embeddings": true,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![vocab, hidden]),
        ("model.norm.weight".into(), vec![hidden]),
    ];
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        for (n, s) in [
            ("input_layernorm", vec![hidden]),
            ("post_attention_layernorm", vec![hidden]),
            ("self_attn.q_proj", vec![heads * 64, hidden]),
            ("self_attn.k_proj", vec![kv * 64, hidden]),
            ("self_attn.v_proj", vec![kv * 64, hidden]),
            ("self_attn.o_proj", vec![hidden, heads * 64]),
            ("mlp.gate_proj", vec![inter, hidden]),
            ("mlp.up_proj", vec![inter, hidden]),
            ("mlp.down_proj", vec![hidden, inter]),
        ] {
            tensors.push((format!("{p}.{n}.weight"), s));
        }
    }
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in &tensors {
        let bytes = 2 * shape.iter().product::<usize>();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut h = serde_json::Value::Object(header).to_string();
    while !h.len().is_multiple_of(8) {
        h.push(' ');
    }
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(dir.join("model.safetensors")).unwrap());
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(h.as_bytes()).unwrap();
    let mut seed = 12345u64;
    for (name, shape) in &tensors {
        let n: usize = shape.iter().product();
        let norm = name.ends_with("norm.weight");
        let scale = 1.0 / (shape.last().copied().unwrap_or(1) as f32).sqrt();
        for _ in 0..n {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
            let v = if norm { 1.0 + 0.1 * r } else { 2.0 * r * scale };
            f.write_all(&half::bf16::from_f32(v).to_le_bytes()).unwrap();
        }
    }
    f.flush().unwrap();
}

#[test]
#[ignore]
fn cpu_prefill_throughput() {
    let hidden = env_usize("HSX_BENCH_HIDDEN", 1024);
    let layers = env_usize("HSX_BENCH_LAYERS", 8);
    let threads = env_usize("HSX_BENCH_THREADS", 0);
    let tokens = env_usize("HSX_BENCH_TOKENS", 512);
    let tmp = tempfile::tempdir().unwrap();
    write_model(tmp.path(), hidden, layers, hidden * 11 / 4, 32000);
    let spec = ModelSpec::from_dir(tmp.path()).unwrap();
    let block = 16;
    let opts = CpuOptions {
        capture_layers: vec![2, layers / 2, layers - 3, layers],
        num_blocks: 4 * tokens / block + 4,
        block_size: block,
        threads,
    };
    let t0 = Instant::now();
    let mut be = CpuBackend::load(tmp.path(), spec, opts).unwrap();
    eprintln!("load: {:.2?} ({} threads)", t0.elapsed(), be.threads());
    // 4 prompts of `tokens / 4`, packed, sampling each; then one prompt of `tokens` alone.
    let ids: Vec<u32> = (0..tokens as u32).map(|i| (i * 7919) % 32000).collect();
    let quarter = tokens / 4;
    let seqs: Vec<SeqChunk> = (0..4)
        .map(|r| SeqChunk {
            start: 0,
            len: quarter,
            block_table: (0..quarter.div_ceil(block) as u32)
                .map(|b| b + (r * quarter.div_ceil(block)) as u32)
                .collect(),
            sample: true,
        })
        .collect();
    let batch = Batch {
        token_ids: &ids[..4 * quarter],
        seqs: &seqs,
    };
    be.forward(&batch).unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        be.forward(&batch).unwrap();
        let dt = t.elapsed().as_secs_f64();
        eprintln!(
            "packed 4x{quarter}: {:.1} ms, {:.0} tok/s",
            dt * 1e3,
            (4 * quarter) as f64 / dt
        );
    }
    let one = [SeqChunk {
        start: 0,
        len: tokens,
        block_table: (0..tokens.div_ceil(block) as u32).collect(),
        sample: true,
    }];
    let t = Instant::now();
    be.forward(&Batch {
        token_ids: &ids,
        seqs: &one,
    })
    .unwrap();
    let dt = t.elapsed().as_secs_f64();
    eprintln!(
        "one x{tokens}: {:.1} ms, {:.0} tok/s",
        dt * 1e3,
        tokens as f64 / dt
    );
}

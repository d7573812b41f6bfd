//! A random-weight checkpoint written by hsx itself (no torch), for the GPU bench: the GPU
//! machines have no package registry, and a 16 GB model is too big to carry there.
//!
//!     cargo run --release --example random_model -- OUT_DIR
//!         [--shape llama8b|llama1b|tiny|qwen35_9b|qwen35_tiny|nemotronh_8b|nemotronh_tiny|
//!                  qwen3moe_30b|qwen3moe_tiny|glm45_air|glm45_tiny]
//!         [--layers N] [--dtype bf16|f32]
//!
//! `llama*` are Llama-shaped; `qwen35_*` are Qwen3.5 hybrids (`Qwen3_5ForCausalLM`): three
//! Gated DeltaNet layers to one gated full-attention layer, the layout of the fixtures;
//! `nemotronh_*` are Nemotron-H hybrids (`NemotronHForCausalLM`, `backbone.*` names): Mamba-2,
//! relu² MLP and attention blocks in Nemotron-H-8B's pattern (`--layers N` keeps its first N);
//! `qwen3moe_*` are Qwen3-MoE models (`Qwen3MoeForCausalLM`, per-expert tensors as on the Hub);
//! `glm45_*` are GLM-4.5 models (`Glm4MoeForCausalLM`: layer 0 dense, then routed experts and
//! a shared expert).
//!
//! Writes `config.json`, `model-0000i-of-0000n.safetensors` shards (≤ 4 GiB each) and
//! `model.safetensors.index.json`, as Hugging Face does. Weights are uniform with std 0.02
//! (as `initializer_range`), norms are 1; a fixed seed per tensor name, so a rerun gives the
//! same bytes. Streams each tensor to disk: memory stays at one tensor.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use half::bf16;
use rayon::prelude::*;
use serde_json::json;

#[path = "random_model_shapes.rs"]
mod shapes;
use shapes::{Mamba, Shape, shape};

/// Qwen3.5's `full_attention_interval` default: every 4th layer is full attention.
fn is_full_attention(layer: usize) -> bool {
    (layer + 1).is_multiple_of(4)
}

struct Args {
    out: PathBuf,
    shape: Shape,
    f32: bool,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut out = None;
    let mut shape_name = "llama8b".to_string();
    let mut layers = None;
    let mut f32 = false;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--shape" => shape_name = it.next().context("--shape needs a value")?,
            "--layers" => layers = Some(it.next().context("--layers needs a value")?.parse()?),
            "--dtype" => f32 = it.next().context("--dtype needs a value")? == "f32",
            _ if out.is_none() && !a.starts_with("--") => out = Some(PathBuf::from(a)),
            _ => bail!("unexpected argument {a:?}"),
        }
    }
    let mut shape = shape(&shape_name)?;
    if let Some(n) = layers {
        if shape.mamba.is_some_and(|m| n > m.pattern.len()) {
            bail!(
                "--layers {n}: the Nemotron-H pattern has {} blocks",
                shape.layers
            );
        }
        shape.layers = n;
    }
    Ok(Args {
        out: out.context("usage: random_model OUT_DIR [--shape S] [--layers N] [--dtype D]")?,
        shape,
        f32,
    })
}

/// (name, shape) of every tensor, in Hugging Face's order.
fn tensors(s: &Shape) -> Vec<(String, Vec<usize>)> {
    if let Some(m) = s.mamba {
        return nemotron_h_tensors(s, &m);
    }
    let h = s.hidden;
    let mut v: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![s.vocab, h])];
    let mut push = |name: String, shape: Vec<usize>| v.push((name, shape));
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        push(format!("{p}.input_layernorm.weight"), vec![h]);
        match s.gdn {
            Some(g) if !is_full_attention(i) => {
                let qkv = 2 * g.nk * g.dk + g.nv * g.dv;
                let la = format!("{p}.linear_attn");
                push(format!("{la}.A_log"), vec![g.nv]);
                push(format!("{la}.conv1d.weight"), vec![qkv, 1, 4]);
                push(format!("{la}.dt_bias"), vec![g.nv]);
                push(format!("{la}.in_proj_a.weight"), vec![g.nv, h]);
                push(format!("{la}.in_proj_b.weight"), vec![g.nv, h]);
                push(format!("{la}.in_proj_qkv.weight"), vec![qkv, h]);
                push(format!("{la}.in_proj_z.weight"), vec![g.nv * g.dv, h]);
                push(format!("{la}.norm.weight"), vec![g.dv]);
                push(format!("{la}.out_proj.weight"), vec![h, g.nv * g.dv]);
            }
            _ => {
                let (q, kv) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
                let sa = format!("{p}.self_attn");
                // Qwen3.5's q_proj carries the output gate beside q, per head.
                let gated = if s.gdn.is_some() { 2 } else { 1 };
                push(format!("{sa}.q_proj.weight"), vec![gated * q, h]);
                push(format!("{sa}.k_proj.weight"), vec![kv, h]);
                push(format!("{sa}.v_proj.weight"), vec![kv, h]);
                push(format!("{sa}.o_proj.weight"), vec![h, q]);
                let glm = s.moe.is_some_and(|m| m.glm_dense.is_some());
                if glm {
                    push(format!("{sa}.q_proj.bias"), vec![q]);
                    push(format!("{sa}.k_proj.bias"), vec![kv]);
                    push(format!("{sa}.v_proj.bias"), vec![kv]);
                } else if s.gdn.is_some() || s.moe.is_some() {
                    push(format!("{sa}.q_norm.weight"), vec![s.head_dim]);
                    push(format!("{sa}.k_norm.weight"), vec![s.head_dim]);
                }
            }
        }
        push(format!("{p}.post_attention_layernorm.weight"), vec![h]);
        if let Some(m) = s.moe {
            for (name, shape) in m.mlp_tensors(&p, i, h, s.intermediate) {
                push(name, shape);
            }
            continue;
        }
        push(format!("{p}.mlp.gate_proj.weight"), vec![s.intermediate, h]);
        push(format!("{p}.mlp.up_proj.weight"), vec![s.intermediate, h]);
        push(format!("{p}.mlp.down_proj.weight"), vec![h, s.intermediate]);
    }
    push("model.norm.weight".into(), vec![h]);
    push("lm_head.weight".into(), vec![s.vocab, h]);
    v
}

/// Nemotron-H's tensors: `backbone.*`, one mixer per block of the pattern.
fn nemotron_h_tensors(s: &Shape, m: &Mamba) -> Vec<(String, Vec<usize>)> {
    let h = s.hidden;
    let mut v: Vec<(String, Vec<usize>)> =
        vec![("backbone.embeddings.weight".into(), vec![s.vocab, h])];
    let mut push = |name: String, shape: Vec<usize>| v.push((name, shape));
    for (i, block) in m.pattern.chars().take(s.layers).enumerate() {
        let p = format!("backbone.layers.{i}.mixer");
        match block {
            'M' => {
                let in_proj = m.inner() + m.conv() + m.heads;
                push(format!("{p}.A_log"), vec![m.heads]);
                push(format!("{p}.D"), vec![m.heads]);
                push(format!("{p}.conv1d.bias"), vec![m.conv()]);
                push(format!("{p}.conv1d.weight"), vec![m.conv(), 1, 4]);
                push(format!("{p}.dt_bias"), vec![m.heads]);
                push(format!("{p}.in_proj.weight"), vec![in_proj, h]);
                push(format!("{p}.norm.weight"), vec![m.inner()]);
                push(format!("{p}.out_proj.weight"), vec![h, m.inner()]);
            }
            '*' => {
                let (q, kv) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
                push(format!("{p}.q_proj.weight"), vec![q, h]);
                push(format!("{p}.k_proj.weight"), vec![kv, h]);
                push(format!("{p}.v_proj.weight"), vec![kv, h]);
                push(format!("{p}.o_proj.weight"), vec![h, q]);
            }
            _ => {
                push(format!("{p}.up_proj.weight"), vec![s.intermediate, h]);
                push(format!("{p}.down_proj.weight"), vec![h, s.intermediate]);
            }
        }
        push(format!("backbone.layers.{i}.norm.weight"), vec![h]);
    }
    push("backbone.norm_f.weight".into(), vec![h]);
    push("lm_head.weight".into(), vec![s.vocab, h]);
    v
}

/// Nemotron-H's config.json, as transformers 5 writes it (`layers_block_type`).
fn nemotron_h_config(s: &Shape, m: &Mamba, f32: bool) -> serde_json::Value {
    let types: Vec<&str> = (m.pattern.chars().take(s.layers))
        .map(|b| match b {
            'M' => "linear_attention",
            '*' => "full_attention",
            _ => "mlp",
        })
        .collect();
    json!({
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "layers_block_type": types,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "attention_bias": false,
        "mamba_num_heads": m.heads,
        "mamba_head_dim": m.head_dim,
        "ssm_state_size": m.d_state,
        "n_groups": m.groups,
        "conv_kernel": 4,
        "chunk_size": 128,
        "expand": 2,
        "use_conv_bias": true,
        "use_bias": false,
        "mamba_hidden_act": "silu",
        "mlp_hidden_act": "relu2",
        "mlp_bias": false,
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_floor": 0.0001,
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": false,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": false,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "dtype": if f32 { "float32" } else { "bfloat16" },
    })
}

fn config_json(s: &Shape, f32: bool) -> serde_json::Value {
    if let Some(m) = s.mamba {
        return nemotron_h_config(s, &m, f32);
    }
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": s.rope_theta,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "mlp_bias": false,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": if f32 { "float32" } else { "bfloat16" },
    });
    if let Some(m) = s.moe {
        let map = c.as_object_mut().expect("an object");
        map.remove("mlp_bias");
        for (k, v) in m.config(s.rope_theta).as_object().expect("an object") {
            map.insert(k.clone(), v.clone());
        }
    }
    if let Some(g) = s.gdn {
        let types: Vec<&str> = (0..s.layers)
            .map(|i| {
                if is_full_attention(i) {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        let extra = json!({
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": s.rope_theta,
                "partial_rotary_factor": 0.25
            },
            "layer_types": types,
            "linear_conv_kernel_dim": 4,
            "linear_num_key_heads": g.nk,
            "linear_num_value_heads": g.nv,
            "linear_key_head_dim": g.dk,
            "linear_value_head_dim": g.dv,
            "dtype": if f32 { "float32" } else { "bfloat16" },
        });
        let map = c.as_object_mut().expect("an object");
        map.remove("rope_theta");
        map.remove("mlp_bias");
        for (k, v) in extra.as_object().expect("an object") {
            map.insert(k.clone(), v.clone());
        }
    }
    c
}

/// Values of one tensor, uniform with std 0.02 (norm weights: 1), from a per-name seed.
fn values(name: &str, n: usize) -> Vec<f32> {
    if name.ends_with("norm.weight") {
        return vec![1.0; n];
    }
    let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let half_width = 0.02f32 * 3f32.sqrt();
    let mut out = vec![0f32; n];
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            // splitmix64 per chunk: independent streams, same bytes whatever the thread count.
            let mut x = seed ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for v in chunk {
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                let u = (z >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                *v = (2.0 * u - 1.0) * half_width;
            }
        });
    out
}

fn bytes_of(vals: &[f32], f32: bool) -> Vec<u8> {
    if f32 {
        bytemuck::cast_slice(vals).to_vec()
    } else {
        let b: Vec<bf16> = vals.par_iter().map(|&v| bf16::from_f32(v)).collect();
        bytemuck::cast_slice(&b).to_vec()
    }
}

/// Splits the tensors into shards of at most `limit` bytes (a tensor never straddles two).
fn shards(list: &[(String, Vec<usize>)], elem: usize, limit: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![Vec::new()];
    let mut size = 0;
    for (i, (_, shape)) in list.iter().enumerate() {
        let bytes = shape.iter().product::<usize>() * elem;
        if size > 0 && size + bytes > limit {
            out.push(Vec::new());
            size = 0;
        }
        out.last_mut().unwrap().push(i);
        size += bytes;
    }
    out
}

fn write_shard(
    path: &Path,
    list: &[(String, Vec<usize>)],
    members: &[usize],
    f32: bool,
) -> Result<()> {
    let elem = if f32 { 4 } else { 2 };
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for &i in members {
        let (name, shape) = &list[i];
        let bytes = shape.iter().product::<usize>() * elem;
        let dtype = if f32 { "F32" } else { "BF16" };
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut h = serde_json::to_vec(&header)?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let tmp = path.with_extension("tmp");
    let mut w = BufWriter::with_capacity(1 << 24, File::create(&tmp)?);
    w.write_all(&(h.len() as u64).to_le_bytes())?;
    w.write_all(&h)?;
    for &i in members {
        let (name, shape) = &list[i];
        w.write_all(&bytes_of(&values(name, shape.iter().product()), f32))?;
    }
    w.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn main() -> Result<()> {
    let a = parse_args()?;
    std::fs::create_dir_all(&a.out)?;
    let list = tensors(&a.shape);
    let elem = if a.f32 { 4 } else { 2 };
    let groups = shards(&list, elem, 4 << 30);
    let mut weight_map = BTreeMap::new();
    let mut total = 0usize;
    for (s, members) in groups.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, groups.len());
        eprintln!("writing {file} ({} tensors)", members.len());
        write_shard(&a.out.join(&file), &list, members, a.f32)?;
        for &i in members {
            weight_map.insert(list[i].0.clone(), file.clone());
            total += list[i].1.iter().product::<usize>() * elem;
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(
        a.out.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index)?,
    )?;
    std::fs::write(
        a.out.join("config.json"),
        serde_json::to_vec_pretty(&config_json(&a.shape, a.f32))?,
    )?;
    let params: usize = list.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    eprintln!("{}: {params} parameters, {total} bytes", a.out.display());
    Ok(())
}

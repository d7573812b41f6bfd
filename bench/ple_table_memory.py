#!/usr/bin/env python3
"""Peak memory of `hsx extract` on a Gemma 4 E2B-shaped per-layer embedding table.

    /work/venv/bin/python bench/ple_table_memory.py HSX_BINARY [OUT_DIR]

Writes (once) a random bf16 checkpoint whose per-layer table has E2B's shape (vocab 262,144,
35 layers x 256 values per token: 2.35 G values, 4.7 GB) around small layers (hidden 256), so
the table is nearly all of it; then runs `HSX_BINARY extract` over 64 prompts of 512 random
tokens, polling /proc every 0.1 s, and prints its peak RSS (and of it the anonymous memory,
which only the process can free, and the file-backed pages of the mapped checkpoint, which the
kernel drops under memory pressure) and wall time. Run it with two builds to
compare (OUT_DIR defaults to /tmp/hsx-bench/ple; keep it outside the repository).
"""

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

REPO = Path(__file__).resolve().parent.parent
LAYERS, PLE_DIM, VOCAB = 35, 256, 262144


def config() -> dict:
    cfg = json.loads((REPO / "tests/fixtures/models/gemma4_e2b/config.json").read_text())
    cfg.pop("per_layer_config", None)
    cfg.update(
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        num_hidden_layers=LAYERS,
        hidden_size_per_layer_input=PLE_DIM,
        layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(LAYERS)],
        num_kv_shared_layers=20,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        global_head_dim=64,
        sliding_window=512,
        dtype="bfloat16",
    )
    return cfg


def bf16_random(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """N(0, 0.02) values as bf16 bits (truncated), made in slices to bound memory."""
    out = np.empty(shape, dtype=np.uint16)
    flat = out.reshape(-1)
    step = 1 << 26
    for i in range(0, flat.size, step):
        x = rng.standard_normal(min(step, flat.size - i), dtype=np.float32) * 0.02
        flat[i : i + x.size] = (x.view(np.uint32) >> 16).astype(np.uint16)
    return out


def build(out: Path) -> None:
    if (out / "model.safetensors").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    cfg = config()
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    rng = np.random.default_rng(7)
    tensors = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        arr = bf16_random(tuple(p.shape), rng)
        if name.endswith("norm.weight") or name.endswith("layer_scalar"):
            arr[...] = 0x3F80  # 1.0
        tensors[name] = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"))


def run(binary: str, out: Path) -> None:
    rng = np.random.default_rng(11)
    prompts = out / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(64):
            ids = rng.integers(0, VOCAB, 512).tolist()
            f.write(json.dumps({"id": f"p{i:02}", "token_ids": ids}) + "\n")
    toml = out / "hsx.toml"
    toml.write_text(
        f'[model]\npath = "{out}"\ndevice = "cpu"\n\n[engine]\nmax_num_batched_tokens = 2048\n'
        f'layer_ids = [0, 2, 17, 35]\n\n[output]\ndir = "{out}/files"\n'
    )
    shutil.rmtree(out / "files", ignore_errors=True)
    t0 = time.time()
    cmd = [binary, "extract", "--config", str(toml), "--input", str(prompts)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    while proc.poll() is None:
        peak = {k: max(v, status_kib(proc.pid, k)) for k, v in peak.items()}
        time.sleep(0.1)
    wall = time.time() - t0
    _, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"hsx failed ({proc.returncode}):\n{err[-3000:]}")
    mib = {k: f"{v / 1024:.0f} MiB" for k, v in peak.items()}
    print(
        f"{binary}: peak RSS {mib['VmRSS']} (anonymous {mib['RssAnon']}, file-backed "
        f"{mib['RssFile']}), {wall:.1f} s for 64 x 512 tokens"
    )


def status_kib(pid: int, key: str) -> int:
    """`key` of /proc/PID/status in KiB (0 once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def main() -> None:
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/hsx-bench/ple")
    build(out)
    run(sys.argv[1], out)


if __name__ == "__main__":
    main()

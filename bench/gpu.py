#!/usr/bin/env python3
"""The GPU bench row (issue 7): hsx on CUDA with an 8B-shaped random-weight model, and
transformers on the same GPU when torch is there.

    python3 bench/gpu.py --hsx target/release/hsx \
        --random-model target/release/examples/random_model [--work /tmp/hsx-gpu] \
        [--shape llama8b] [--model-layers N] [--tokens 200000] [--min-len 1024] [--max-len 4096] \
        [--budget 8192] [--layers 2,16,29,32] [--long 32768] [--long-layers 2,8,16,24,32] \
        [--peer-python python3] [--peer-batch 4] [--peer-max-seconds S] [--no-peer] [--device cuda]

Build both binaries on the development machine (`cargo build --release --features cuda
--bin hsx --example random_model`; the GPU machines have no package registry) and run this
there. Standard library only. Steps:
  1. the model: `random_model WORK/model --shape S` (bf16; skipped when config.json is there;
     `--shape qwen35_9b` is a 9B-class Qwen3.5 hybrid, `--shape nemotronh_8b` Nemotron-H-8B's
     geometry, Mamba-2 hybrid);
  2. prompts: bench/make_prompts.py, lengths log-uniform in [min-len, max-len];
  3. hsx extract writing files, then compute-only (HSX_BENCH_DISCARD_OUTPUT=1);
     tok/s, MFU = model FLOPs / s / the GPU's dense bf16 peak, peak device memory
     (nvidia-smi polled every 0.1 s);
  4. one --long-token prompt with 5 captured layers: peak device memory against the model's
     own memory figures, to show that capture memory follows the token budget, not the prompt;
  5. the peer (bench/peer_transformers.py --device cuda, modes usual and best), when
     `--peer-python -c "import torch; torch.cuda.is_available()"` says yes.
`--device cpu` runs the same steps on the CPU with a tiny shape (how the harness is tested
without a GPU: `--device cpu --shape tiny --tokens 2000 --min-len 32 --max-len 256`).
Prints one markdown table and writes WORK/gpu_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from run import attention_flops, linear_flops_per_token, parse_hsx  # noqa: E402

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from NVIDIA's data sheets.
PEAKS = {"H100 SXM": 989.4, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.4, "A100": 312.0}


def gpu_peak_tflops(name: str) -> float | None:
    for key, v in PEAKS.items():
        if all(part in name for part in key.split()):
            return v
    return None


class MemoryPoller:
    """Peak `memory.used` of GPU 0 (MiB) while running, from nvidia-smi."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.peak = None
        self._stop = threading.Event()

    def __enter__(self):
        if self.enabled:
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                    capture_output=True, text=True, timeout=5,
                ).stdout.strip()
                self.peak = max(self.peak or 0, int(out.splitlines()[0]))
            except (subprocess.SubprocessError, ValueError, IndexError):
                pass
            self._stop.wait(0.1)

    def __exit__(self, *exc):
        self._stop.set()
        if self.enabled:
            self._t.join()


def gpu_name() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown GPU"


def write_config(path: Path, a, model: Path, out: Path, layers: str, max_len: int) -> None:
    path.write_text(
        f"""[model]
path = "{model}"
device = "{a.device}"
[engine]
max_num_batched_tokens = {a.budget}
max_num_seqs = 64
max_waiting = 4096
max_model_len = {max_len}
block_size = 16
num_blocks = {a.num_blocks}
layer_ids = [{layers}]
dtype = "auto"
[output]
dir = "{out}"
lock_files = false
max_concurrent_writes = 8
"""
    )


def run_hsx(a, model: Path, prompts: Path, tag: str, layers: str, discard: bool, max_len: int) -> dict:
    lens = [len(json.loads(line)["token_ids"]) for line in open(prompts)]
    work = Path(a.work) / "runs" / tag
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    write_config(work / "config.toml", a, model, work / "out", layers, max_len)
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
    if discard:
        env["HSX_BENCH_DISCARD_OUTPUT"] = "1"
    cmd = [a.hsx, "extract", "--config", str(work / "config.toml"), "--input", str(prompts), "--quiet"]
    with MemoryPoller(a.device != "cpu") as mem:
        t0 = time.time()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.time() - t0
    (work / "stderr.log").write_text(r.stderr)
    res = dict(tag=tag, rc=r.returncode, wall=round(wall, 2), peak_device_mib=mem.peak)
    parsed = parse_hsx(r.stderr)
    if r.returncode != 0 or parsed is None or parsed[0] != len(lens):
        err = [line for line in r.stderr.splitlines() if line.strip()]
        res["error"] = err[-1] if err else f"exit {r.returncode}"
        return res
    tokens, secs = sum(lens), max(parsed[1], 1e-3)
    flops = linear_flops_per_token(model) * tokens + attention_flops(model, lens)
    res.update(tokens=tokens, seconds=secs, tok_s=tokens / secs, tflops=flops / secs / 1e12,
               memory_log=[line for line in r.stderr.splitlines() if "memory" in line.lower()][-8:],
               runner=next((line[line.index("model runner:"):] for line in r.stderr.splitlines()
                            if "model runner:" in line), None))
    shutil.rmtree(work / "out", ignore_errors=True)
    return res


def peer_available(python: str, device: str) -> bool:
    check = "import torch, transformers" + ("" if device == "cpu" else "; assert torch.cuda.is_available()")
    r = subprocess.run([python, "-c", check], capture_output=True)
    return r.returncode == 0


def run_peer(a, model: Path, prompts: Path, mode: str) -> dict:
    cmd = [a.peer_python, str(BENCH / "peer_transformers.py"), "--model", str(model), "--prompts", str(prompts),
           "--mode", mode, "--batch", str(a.peer_batch), "--device", a.device, "--layers", a.layers]
    if a.peer_max_seconds:
        cmd += ["--max-seconds", str(a.peer_max_seconds)]
    with MemoryPoller(a.device != "cpu") as mem:
        r = subprocess.run(cmd, capture_output=True, text=True)
    res = dict(mode=mode, rc=r.returncode, peak_device_mib=mem.peak)
    try:
        res.update(json.loads(r.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        err = [line for line in r.stderr.splitlines() if line.strip()]
        res["error"] = err[-1] if err else f"exit {r.returncode}"
    return res


def prepare(a, work: Path) -> tuple[Path, Path, Path]:
    model = work / "model"
    if not (model / "config.json").exists():
        layers = ["--layers", str(a.model_layers)] if a.model_layers else []
        subprocess.run([a.random_model, str(model), "--shape", a.shape, *layers], check=True)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    prompts, long = work / "prompts.jsonl", work / "long.jsonl"
    mk = [sys.executable, str(BENCH / "make_prompts.py")]
    subprocess.run(mk + [str(prompts), "--tokens", str(a.tokens), "--vocab", str(vocab),
                         "--min-len", str(a.min_len), "--max-len", str(a.max_len)], check=True)
    subprocess.run(mk + [str(long), "--count", "1", "--vocab", str(vocab),
                         "--min-len", str(a.long), "--max-len", str(a.long)], check=True)
    return model, prompts, long


def fmt_tok(r: dict) -> str:
    return f"{r['tok_s']:.0f}" if "tok_s" in r else r.get("error", "–")


def table(a, name: str, peak: float | None, rows: dict) -> str:
    w, c = rows["hsx"], rows["hsx_compute_only"]
    mfu = (lambda r: f"{100 * r['tflops'] / peak:.1f}%" if peak and "tflops" in r else "–")
    tok = (lambda r: f"{r['tok_s']:.0f}" if "tok_s" in r else r.get("error", "–"))
    peer = {m: rows.get(f"peer_{m}", {}) for m in ("usual", "best")}
    ratio = (lambda p: f"{w['tok_s'] / p['tok_per_s']:.2f}×" if "tok_s" in w and "tok_per_s" in p else "–")
    out = [f"GPU bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {name}; "
           f"dense bf16 peak {peak or '?'} TFLOP/s; model {a.shape}; budget {a.budget}; layers {a.layers}",
           "",
           "| run | tok/s | TFLOP/s | MFU | peak device MiB |",
           "|---|---|---|---|---|"]
    for label, r in [("hsx (writing files)", w), ("hsx compute-only", c),
                     ("transformers as usual", peer["usual"]), ("transformers at best", peer["best"])]:
        ts = tok(r) if label.startswith("hsx") else (f"{r['tok_per_s']:.0f}" if "tok_per_s" in r else r.get("error", "not run"))
        tf = f"{r['tflops']:.0f}" if "tflops" in r else "–"
        out.append(f"| {label} | {ts} | {tf} | {mfu(r) if label.startswith('hsx') else '–'} | {r.get('peak_device_mib') or '–'} |")
    out += [f"{label}: {r['runner']}" for label, r in [("hsx (writing files)", w), ("hsx compute-only", c)]
            if r.get("runner")]
    out += ["", f"hsx / transformers as usual: {ratio(peer['usual'])}; at best: {ratio(peer['best'])}",
            f"long prompt ({a.long} tokens, layers {a.long_layers}): {fmt_tok(rows['long'])} tok/s, "
            f"peak device memory {rows['long'].get('peak_device_mib') or '–'} MiB; hsx's memory lines:"]
    out += [f"    {line}" for line in rows["long"].get("memory_log", [])]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hsx", required=True)
    ap.add_argument("--random-model", required=True)
    ap.add_argument("--work", default="/tmp/hsx-gpu")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--model-layers", type=int, default=None,
                    help="keep the shape's first N layers (random_model --layers)")
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--min-len", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--num-blocks", type=int, default=8192)
    ap.add_argument("--layers", default="2,16,29,32")
    ap.add_argument("--long", type=int, default=32768)
    ap.add_argument("--long-layers", default="2,8,16,24,32")
    ap.add_argument("--peer-python", default="python3")
    ap.add_argument("--peer-batch", type=int, default=4)
    ap.add_argument("--no-peer", action="store_true", help="hsx only (no transformers runs)")
    ap.add_argument("--peer-max-seconds", type=float, default=None,
                    help="stop each peer run after the batch that crosses this time")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model, prompts, long = prepare(a, work)
    rows = {
        "hsx": run_hsx(a, model, prompts, "hsx", a.layers, False, a.max_len),
        "hsx_compute_only": run_hsx(a, model, prompts, "hsx_compute_only", a.layers, True, a.max_len),
        "long": run_hsx(a, model, long, "long", a.long_layers, True, a.long),
    }
    if a.no_peer:
        rows["peer_usual"] = rows["peer_best"] = {"error": "not run (--no-peer)"}
    elif peer_available(a.peer_python, a.device):
        for mode in ("usual", "best"):
            rows[f"peer_{mode}"] = run_peer(a, model, prompts, mode)
    else:
        rows["peer_usual"] = rows["peer_best"] = {"error": f"no torch (with {a.device}) in {a.peer_python}"}
    name = gpu_name() if a.device != "cpu" else "cpu"
    peak = gpu_peak_tflops(name)
    (work / "gpu_results.json").write_text(json.dumps(dict(gpu=name, peak_tflops=peak, **rows), indent=1))
    print(table(a, name, peak, rows))
    return 0 if all("error" not in rows[k] for k in ("hsx", "hsx_compute_only", "long")) else 1


if __name__ == "__main__":
    sys.exit(main())

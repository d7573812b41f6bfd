#!/usr/bin/env python3
"""hsx vs transformers on the same models, prompts and machine; prints one table.

    bench/run.sh [--tokens 100000] [--min-len 32] [--max-len 2048] [--work /tmp/hsx-bench] [--threads 2]
                 [--models llama,qwen3_5,qwen3_moe] (also glm4_moe, glm4_moe_lite, minimax_m2,
                 llama4, gemma3, granite_h, mimo_v2_flash)
                 [--dtypes f32,bf16] [--python /work/venv/bin/python] [--pairs 2] [--no-peer] [--smoke]

Steps (bench/README.md has the details):
 1. `cargo build --release` of hsx and of the `gemm_peak` example (unless --hsx is given);
 2. the models (bench/make_models.py, with the venv's torch) and the prompt set
    (bench/make_prompts.py) under --work, reused when present;
 3. `gemm_peak`: the FMA peak of this machine and hsx's GEMM rate at the model's shapes;
 4. per model and dtype: `hsx extract` writing files (W) and `hsx extract` compute-only
    (C, HSX_BENCH_DISCARD_OUTPUT=1: files are not written), interleaved in --pairs pairs W C, C W,
    W C, ... (so drift in the other load hits both alike); write/compute is the median of the
    per-pair ratios, tok/s the median of each kind's runs; then the peer as usually run and at its
    best (bench/peer_transformers.py); each run's wall time, tokens/s, peak RSS (/usr/bin/time)
    and the CPU that other processes used meanwhile (/proc/stat minus our own CPU time);
 5. a memory run: 10 and then 100 requests through hsx (with max_pending_bytes --mem-pending-mib),
    peak RSS of each;
 6. the table (stdout) and every raw result (--work/results.json).

--smoke: the CI-sized run: the bundled tiny fixture models (tests/fixtures/models/llama and
llama_bf16), 6 prompts, no peer, no model generation; checks that every step works.
A hybrid model runs when `hsx` supports its architecture; otherwise its row says why it was
skipped (the error hsx gave).
"""

from __future__ import annotations

import argparse
import math
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
HZ = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def children_cpu() -> float:
    r = os.times()
    return r.children_user + r.children_system


def timed(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Runs cmd under /usr/bin/time; wall seconds, peak RSS (MiB), load by other processes."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        full = ["/usr/bin/time", "-f", "%M", "-o", tf.name] + cmd if Path("/usr/bin/time").exists() else cmd
        b0, c0, t0 = cpu_jiffies()[0], children_cpu(), time.perf_counter()
        with open("/proc/loadavg") as f:
            load_before = float(f.read().split()[0])
        p = subprocess.run(full, env=env, cwd=cwd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        busy = (cpu_jiffies()[0] - b0) / HZ
        ours = children_cpu() - c0
        rss = None
        try:
            rss = int(tf.read().strip().splitlines()[-1]) / 1024
        except (ValueError, IndexError):
            pass
    return dict(
        rc=p.returncode,
        stdout=p.stdout,
        stderr=p.stderr,
        wall=wall,
        rss_mib=rss,
        cpu_s=ours,
        other_cores=max(0.0, (busy - ours) / wall) if wall > 0 else 0.0,
        load_before=load_before,
    )


def st_header(model_dir: Path) -> dict:
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            out.update(json.loads(fh.read(n)))
    out.pop("__metadata__", None)
    return out


def linear_flops_per_token(model_dir: Path) -> float:
    """2 x the parameters of every projection weight but the embedding and the LM head; routed
    experts (one 2-D tensor per expert, or fused 3-D ones) count top_k / experts of theirs: the
    weights a token runs through."""
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    active = cfg["num_experts_per_tok"] / experts if experts else 1.0
    n = 0.0
    for name, t in st_header(model_dir).items():
        embedding = "embed_tokens" in name or name == "backbone.embeddings.weight"
        if len(t["shape"]) not in (2, 3) or embedding or name.startswith("lm_head"):
            continue
        size = math.prod(t["shape"])
        # Granite keeps its experts fused as `block_sparse_moe.{input,output}_linear`.
        routed = ".experts." in name or "block_sparse_moe.input_linear" in name \
            or "block_sparse_moe.output_linear" in name
        n += size * active if routed else size
    return 2.0 * n


def attention_flops(model_dir: Path, prompts: list[int]) -> float:
    """QK and PV flops of the full-attention layers: 4 * heads * head_dim per (query, key)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    heads = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    # Qwen3.5's layer_types; Nemotron-H's layers_block_type (transformers 5); Llama-4's
    # chunked_attention layers see keys p - p % chunk ..= p; Gemma-3's sliding_attention layers
    # the last `sliding_window`.
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    n_attn = sum(t == "full_attention" for t in types) if types else cfg["num_hidden_layers"]
    pairs = sum(n * (n + 1) // 2 for n in prompts)
    chunk = cfg.get("attention_chunk_size")
    n_chunked = sum(t == "chunked_attention" for t in types or [])
    chunked_pairs = sum(p % chunk + 1 for n in prompts for p in range(n)) if n_chunked else 0
    n_sliding = sum(t == "sliding_attention" for t in types or [])
    window = cfg.get("sliding_window")
    sliding_pairs = sum(min(p + 1, window) for n in prompts for p in range(n)) if n_sliding else 0
    return 4.0 * heads * hd * (n_attn * pairs + n_chunked * chunked_pairs + n_sliding * sliding_pairs)


MAX_NUM_SEQS, MAX_WAITING = 32, 1024


def hsx_config(path: Path, model: Path, out: Path, threads: int, budget: int, pending_bytes: int) -> None:
    path.write_text(
        f"""[model]
path = "{model}"
device = "cpu"
threads = {threads}
[engine]
max_num_batched_tokens = {budget}
max_num_seqs = {MAX_NUM_SEQS}
max_waiting = {MAX_WAITING}
max_model_len = 0
block_size = 16
num_blocks = 1024
dtype = "auto"
max_pending_bytes = {pending_bytes}
[output]
dir = "{out}"
lock_files = false
max_concurrent_writes = 4
"""
    )


def parse_hsx(stderr: str) -> tuple[int, float] | None:
    """(completed requests, seconds) from hsx extract's summary line
    ("completed N, ...; ... in S.SSs (R tokens/s)")."""
    for line in stderr.splitlines():
        m = re.search(r"completed (\d+),.* in ([\d.]+)s \(", line)
        if m:
            return int(m.group(1)), float(m.group(2))
    return None


def run_hsx(args, hsx: Path, model: Path, prompts: Path, tag: str, discard: bool,
            pending_bytes: int = 2 << 30) -> dict:
    lens = [len(json.loads(line)["token_ids"]) for line in open(prompts)]
    work = Path(args.work) / "runs" / tag
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    hsx_config(work / "config.toml", model, work / "out", args.threads, args.budget, pending_bytes)
    env = dict(os.environ)
    if discard:
        env["HSX_BENCH_DISCARD_OUTPUT"] = "1"
    r = timed([str(hsx), "extract", "--config", str(work / "config.toml"), "--input", str(prompts), "--quiet"], env=env)
    parsed = parse_hsx(r["stderr"])
    res = dict(tag=tag, rc=r["rc"], rss_mib=r["rss_mib"], other_cores=r["other_cores"], wall=r["wall"],
               cpu_s=r["cpu_s"])
    if r["rc"] != 0 or parsed is None or parsed[0] != len(lens):
        err = [line for line in r["stderr"].splitlines() if line.strip()]
        res["error"] = err[-1] if err else f"exit {r['rc']}"
        return res
    tokens, secs = sum(lens), max(parsed[1], 1e-3)
    files = list((work / "out").glob("*.safetensors"))
    res.update(tokens=tokens, seconds=secs, tok_s=tokens / secs, files=len(files),
               out_bytes=sum(f.stat().st_size for f in files))
    shutil.rmtree(work / "out", ignore_errors=True)
    return res


def run_pairs(args, hsx: Path, model: Path, prompts: Path, tag: str, results: dict) -> tuple[list, str | None]:
    """--pairs pairs of (writing, compute-only) runs, interleaved W C, C W, W C, ...: both kinds
    see the same other load on a shared machine. Returns the pairs, or the error of a writing run."""
    pairs = []
    for i in range(args.pairs):
        got = {}
        for discard in ((False, True) if i % 2 == 0 else (True, False)):
            kind = "compute-only" if discard else "writing files"
            log(f"{tag}: pair {i + 1}/{args.pairs}: hsx {kind}")
            r = run_hsx(args, hsx, model, prompts, f"{tag}_{'nowrite' if discard else 'write'}{i}", discard)
            r.update(pair=i, discard=discard)
            results["runs"].append(r)
            if "error" in r and not discard:
                return pairs, r["error"]
            got[discard] = r
        pairs.append((got[False], got[True]))
    return pairs, None


def median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_peer(args, model: Path, prompts: Path, mode: str) -> dict:
    cmd = [args.python, str(BENCH / "peer_transformers.py"), "--model", str(model), "--prompts", str(prompts),
           "--mode", mode, "--threads", str(args.threads), "--batch", str(args.peer_batch)]
    if args.peer_max_seconds:
        cmd += ["--max-seconds", str(args.peer_max_seconds)]
    r = timed(cmd)
    res = dict(mode=mode, rc=r["rc"], rss_mib=r["rss_mib"], other_cores=r["other_cores"], wall=r["wall"])
    try:
        res.update(json.loads(r["stdout"].strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        err = [line for line in r["stderr"].splitlines() if line.strip()]
        res["error"] = err[-1] if err else f"exit {r['rc']}"
    return res


def fmt(v, spec: str = ".0f", none: str = "–") -> str:
    return none if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/hsx-bench")
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--min-len", type=int, default=32, help="shortest prompt (make_prompts.py)")
    ap.add_argument("--max-len", type=int, default=2048,
                    help="longest prompt; equal to --min-len for one length (attention-bound runs: 4000)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=int, default=2048, help="hsx max_num_batched_tokens")
    ap.add_argument("--models", default="llama,qwen3_5,qwen3_moe")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--python", default="/work/venv/bin/python")
    ap.add_argument("--peer-batch", type=int, default=4)
    ap.add_argument("--peer-max-seconds", type=float, default=150.0,
                    help="time cap per peer run (0: none); tok/s is then over the batches it ran")
    ap.add_argument("--pairs", type=int, default=2,
                    help="interleaved (writing, compute-only) hsx run pairs per model and dtype")
    ap.add_argument("--mem-pending-mib", type=int, default=32,
                    help="engine.max_pending_bytes (MiB) of the memory runs")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-memory", action="store_true", help="skip the 10/100-request memory runs")
    ap.add_argument("--hsx", default=None, help="hsx binary (default: build target/release/hsx)")
    ap.add_argument("--gemm-peak", default=None, help="gemm_peak binary (default: next to --hsx)")
    ap.add_argument("--smoke", action="store_true", help="CI-sized run on the tiny fixture models")
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    if args.hsx:
        hsx = Path(args.hsx)
        peak_bin = Path(args.gemm_peak) if args.gemm_peak else hsx.parent / "examples" / "gemm_peak"
    else:
        log("cargo build --release (hsx, gemm_peak)")
        subprocess.run(["cargo", "build", "--release", "--bin", "hsx", "--example", "gemm_peak"], cwd=REPO, check=True)
        hsx = REPO / "target" / "release" / "hsx"
        peak_bin = REPO / "target" / "release" / "examples" / "gemm_peak"

    if args.smoke:
        args.no_peer = True
        fixtures = REPO / "tests" / "fixtures" / "models"
        models = {("llama", "f32"): fixtures / "llama", ("llama", "bf16"): fixtures / "llama_bf16",
                  ("qwen3_moe", "f32"): fixtures / "qwen3_moe", ("glm4_moe", "f32"): fixtures / "glm4_moe"}
        vocab, prompt_args = 512, ["--count", "6", "--min-len", "8", "--max-len", "200"]
    else:
        mdir = work / "models"
        wanted = [f"{m}_{d}" for m in args.models.split(",") for d in args.dtypes.split(",")]
        missing = [w for w in wanted if not (mdir / w / "config.json").exists()]
        if missing:
            log(f"building models {missing}")
            subprocess.run([args.python, str(BENCH / "make_models.py"), str(mdir), "--only", *missing], check=True)
        models = {(m, d): mdir / f"{m}_{d}" for m in args.models.split(",") for d in args.dtypes.split(",")}
        vocab = 32000
        prompt_args = ["--tokens", str(args.tokens), "--min-len", str(args.min_len), "--max-len", str(args.max_len)]
    # The default lengths keep the file name the earlier runs used.
    lengths = "" if (args.min_len, args.max_len) == (32, 2048) else f"-{args.min_len}-{args.max_len}"
    prompts = work / ("prompts-smoke.jsonl" if args.smoke else f"prompts-{args.tokens}{lengths}.jsonl")
    subprocess.run([sys.executable, str(BENCH / "make_prompts.py"), str(prompts), "--vocab", str(vocab), *prompt_args],
                   check=True)
    lens = [len(json.loads(line)["token_ids"]) for line in open(prompts)]

    log("gemm_peak")
    pk = subprocess.run([str(peak_bin), "--threads", str(args.threads), "--json"] + (["--rows", "256"] if args.smoke else []),
                        capture_output=True, text=True, check=True)
    peak = json.loads(pk.stdout)

    rows, results = [], dict(peak=peak, runs=[])
    for (name, dtype), mdir in models.items():
        if not (mdir / "config.json").exists():
            rows.append(dict(model=name, dtype=dtype, skip=f"no model at {mdir}"))
            continue
        tag = f"{name}_{dtype}"
        pairs, error = run_pairs(args, hsx, mdir, prompts, tag, results)
        if error:
            rows.append(dict(model=name, dtype=dtype, skip=f"hsx: {error}"))
            log(f"{tag}: skipped: {error}")
            continue
        ratios = [w["tok_s"] / c["tok_s"] for w, c in pairs if c.get("tok_s")]
        cpu_ratios = [c["cpu_s"] / w["cpu_s"] for w, c in pairs if c.get("tok_s") and w["cpu_s"] > 0]
        row = dict(model=name, dtype=dtype, pairs=pairs, ratios=ratios, ratio=median(ratios),
                   cpu_ratio=median(cpu_ratios),
                   hsx_tok_s=median([w["tok_s"] for w, _ in pairs]),
                   compute_tok_s=median([c.get("tok_s") for _, c in pairs]),
                   rss_mib=max((w["rss_mib"] for w, _ in pairs if w["rss_mib"] is not None), default=None))
        log(f"{tag}: {row['hsx_tok_s']:.0f} tok/s writing, write/compute "
            f"{'/'.join(f'{100 * x:.0f}%' for x in ratios) or '–'}")
        seconds = sum(lens) / row["hsx_tok_s"]
        lin = linear_flops_per_token(mdir) * sum(lens)
        att = attention_flops(mdir, lens)
        row["gflops"] = (lin + att) / seconds / 1e9
        row["gemm_gflops"] = lin / seconds / 1e9
        if not args.no_peer:
            for mode in ("usual", "best"):
                log(f"{tag}: peer {mode}")
                p = run_peer(args, mdir, prompts, mode)
                results["runs"].append(dict(tag=f"{tag}_peer_{mode}", **p))
                row[mode] = p
        rows.append(row)

    mem = []
    if not args.no_memory:
        key = ("llama", "f32") if ("llama", "f32") in models else next(iter(models))
        mdir = models[key]
        for n in (10, 100):
            p = work / f"mem-{n}.jsonl"
            subprocess.run([sys.executable, str(BENCH / "make_prompts.py"), str(p), "--vocab", str(vocab), "--count",
                            str(n), "--min-len", "64", "--max-len", "64"], check=True)
            log(f"memory run: {n} requests of 64 tokens")
            r = run_hsx(args, hsx, mdir, p, f"mem{n}", discard=False, pending_bytes=args.mem_pending_mib << 20)
            results["runs"].append(r)
            mem.append((n, r))

    # ---- the table -------------------------------------------------------------------------
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    isa = ",".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f" {f}" in flags)
    def row_peak(r: dict) -> float:
        if r["dtype"] == "bf16" and bf16_path.get("unit_peak_gflops"):
            return bf16_path["unit_peak_gflops"]
        return peak["peak_gflops"]

    # bf16 rows run on the path `cpu_bf16_kernel = "auto"` picks (gemm_peak names it).
    bf16_paths = peak.get("bf16") or [{}]
    bf16_path = next((b for b in bf16_paths if b.get("path") == peak.get("bf16_auto")), bf16_paths[0])
    out = []
    out.append(f"hsx bench, {now}; {cpu} ({os.cpu_count()} cpus; {isa}); {platform.platform()}")
    out.append(f"prompts: {len(lens)} ({sum(lens)} tokens, lengths {min(lens)}..{max(lens)}, log-uniform, seed 5); "
               f"threads {args.threads}; hsx budget {args.budget} tokens/step; peer batch {args.peer_batch}; "
               f"{args.pairs} interleaved writing/compute-only hsx pairs per row")
    out.append(f"FMA peak ({peak['fma']}): {peak['peak_1t_gflops']:.0f} GFLOP/s on 1 thread, "
               f"{peak['peak_gflops']:.0f} on {peak['threads']}; hsx matmul_wt at the model's shapes "
               f"({peak['rows']} rows): {peak['gemm_gflops']:.0f} GFLOP/s "
               f"({100 * peak['gemm_gflops'] / peak['peak_gflops']:.0f}% of peak)")
    units = peak.get("units", {})
    for a in peak.get("attention", []):
        unit = a.get("unit", peak["fma"])
        unit_peak = units.get(unit, {}).get("peak_gflops", peak["peak_gflops"])
        out.append(f"hsx {a.get('path', 'f32')} attention ({a['shape']} heads, one prompt of {a['len']} tokens): "
                   f"{a['gflops']:.0f} GFLOP/s ({100 * a['gflops'] / unit_peak:.0f}% of the {unit} peak)")
    for r in peak.get("recurrences", []):
        out.append(f"hsx {r['recurrence']} (f32, {r['shape']} heads, {r['tokens']} tokens): "
                   f"{r['gflops']:.0f} GFLOP/s ({100 * r['gflops'] / peak['peak_gflops']:.0f}% of the {peak['fma']} peak)")
    if units:
        out.append("unit peaks (register-only probes, 1 thread / " + str(peak["threads"]) + "): " + "; ".join(
            f"{u} {v['peak_1t_gflops']:.0f} / {v['peak_gflops']:.0f} GFLOP/s" for u, v in units.items()))
    for b in peak.get("bf16", []):
        kernel = (f"; the kernel alone, less rounding A: {b['kernel_gflops']:.0f} GFLOP/s "
                  f"({100 * b['kernel_gflops'] / b['unit_peak_gflops']:.0f}%)"
                  if b.get("kernel_gflops") and b["unit_peak_gflops"] else "")
        out.append(f"bf16 weights on the {b['path']} path ({peak['rows']} rows, the same shapes): {b['gflops']:.0f} GFLOP/s "
                   f"({100 * b['gflops'] / b['unit_peak_gflops']:.0f}% of the {b['unit']} peak{kernel})"
                   if b["unit_peak_gflops"] else f"bf16 weights on the {b['path']} path: {b['gflops']:.0f} GFLOP/s")
    f16 = peak.get("f16")
    if f16 and f16.get("unit_peak_gflops"):
        out.append(f"f16 weights on the {f16['path']} path ({peak['rows']} rows, the same shapes): "
                   f"{f16['gflops']:.0f} GFLOP/s ({100 * f16['gflops'] / f16['unit_peak_gflops']:.0f}% of the "
                   f"{f16['unit']} peak)")
    if bf16_path:
        out.append(f"bf16 rows: hsx multiplies bf16 weights on the {bf16_path['path']} path "
                   f"(GFLOP/s column: % of the {bf16_path['unit']} peak)")
    if any(r["dtype"] == "f16" for r in rows):
        out.append(f"f16 rows: hsx multiplies f16 weights widened in registers, f32 FMA "
                   f"(GFLOP/s column: % of the {peak['fma']} peak)")
    out.append("")
    out.append("| model | weights | hsx tok/s | hsx compute-only tok/s | write/compute | peer as usual tok/s | "
               "peer at best tok/s | hsx / usual | hsx / best | hsx peak RSS | hsx GFLOP/s (% of peak) | "
               "other load (cores) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skip" in r:
            out.append(f"| {r['model']} | {r['dtype']} | skipped: {r['skip']} | | | | | | | | | |")
            continue
        wt = r["hsx_tok_s"]
        u, b = r.get("usual", {}), r.get("best", {})
        ut, bt = u.get("tok_per_s"), b.get("tok_per_s")
        ratio = fmt(100 * r["ratio"] if r["ratio"] else None, ".0f") + "%"
        if len(r["ratios"]) > 1:
            ratio += " (" + ", ".join(f"{100 * x:.0f}" for x in r["ratios"]) + ")"
        loads = ", ".join(f"{fmt(w.get('other_cores'), '.2f')}/{fmt(c.get('other_cores'), '.2f')}"
                          for w, c in r["pairs"])
        if u or b:
            loads += "; " + "/".join(fmt(x.get("other_cores"), ".2f") for x in (u, b) if x)
        out.append(
            f"| {r['model']} | {r['dtype']} | {wt:.0f} | {fmt(r['compute_tok_s'])} | {ratio} | "
            f"{fmt(ut)} | {fmt(bt)} | {fmt(wt / ut if ut else None, '.2f')}× | "
            f"{fmt(wt / bt if bt else None, '.2f')}× | {fmt(r['rss_mib'])} MiB | "
            f"{r['gflops']:.0f} ({100 * r['gflops'] / row_peak(r):.0f}%) | {loads} |"
        )
    if mem:
        out.append("")
        out.append(f"Memory (hsx, writing files, 64-token requests; bounds: {args.budget} tokens/step, "
                   f"{MAX_NUM_SEQS} running, {MAX_WAITING} waiting, max_pending_bytes {args.mem_pending_mib} MiB): "
                   + "; ".join(
            f"{n} requests: peak RSS {fmt(r.get('rss_mib'))} MiB, {fmt((r.get('out_bytes') or 0) / 2**20, '.1f')} MiB written"
            for n, r in mem))
    by_cpu = [f"{r['model']} {r['dtype']} {100 * r['cpu_ratio']:.0f}%" for r in rows if r.get("cpu_ratio")]
    if by_cpu:
        out.append("write/compute by hsx's own CPU time (compute-only CPU s / writing CPU s, median over the pairs; "
                   "hardly affected by other load; model loading included): " + ", ".join(by_cpu))
    out.append("tok/s and write/compute: medians over the pairs (write/compute: of the per-pair ratios, "
               "each pair's in parentheses)")
    out.append("other load = cores' worth of CPU used by other processes during each run "
               "(hsx writing/compute-only for each pair; then peer usual/peer best)")
    table = "\n".join(out)
    print(table)
    results.update(table=table, rows=rows)
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    bad = [r for r in rows if "skip" in r and not r["model"].startswith("qwen3_5")]
    if args.smoke:
        ok = not bad and all(w["files"] == len(lens) and c.get("files") == 0
                             for r in rows for w, c in r.get("pairs", []))
        ok = ok and all(len(r["pairs"]) == args.pairs for r in rows if "pairs" in r)
        ok = ok and all(r.get("rc") == 0 and r.get("files") == n for n, r in mem)
        print("smoke:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

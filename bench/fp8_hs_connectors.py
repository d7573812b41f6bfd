#!/usr/bin/env python3
"""hsx `dtype = "fp8"` files read by speculators' own reader, `hs_connectors.FP8Transfer`.

Runs `hsx extract` three times on the same prompts (f32, bf16, fp8), then for every fp8 file:
  - loads it with FP8Transfer(...).get_generated({"hidden_states_path": ...}) (what speculators'
    training loop calls), and checks the dequantized bf16 [T, K, H] and the token ids;
  - checks its codes and scales equal hs_connectors.fp8_utils.quantize_tensor_to_fp8 of the
    f32 file of the same prompt, bit for bit;
  - reports the dequantization error against the f32 states and the file sizes vs bf16.

Needs torch and hs_connectors 0.9.0 (pip install hs_connectors) in a venv outside the repo:

    cargo build --release
    /work/venv/bin/python bench/fp8_hs_connectors.py [--hsx target/release/hsx]
        [--config config.toml] [--input tests/fixtures/prompts.jsonl]

Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from hs_connectors import FP8Transfer
from hs_connectors.fp8_utils import quantize_tensor_to_fp8
from safetensors.torch import load_file


def extract(hsx: str, config: str, prompts: str, out: Path, dtype: str) -> None:
    cmd = [hsx, "extract", "--config", config, "--input", prompts, "--output", str(out),
           "--dtype", dtype, "--quiet"]
    subprocess.run(cmd, check=True)


def check_file(name: str, dirs: dict[str, Path], reader: FP8Transfer) -> tuple[bool, float]:
    f32 = load_file(dirs["f32"] / name)
    raw = load_file(dirs["fp8"] / name)
    got = reader.get_generated({"hidden_states_path": str(dirs["fp8"] / name)})
    hs = got["hidden_states"]
    ok = hs.dtype == torch.bfloat16 and hs.shape == f32["hidden_states"].shape
    ok &= set(got) == {"hidden_states", "token_ids"}
    ok &= torch.equal(got["token_ids"], f32["token_ids"])
    codes, scales = quantize_tensor_to_fp8(f32["hidden_states"])
    same_codes = torch.equal(raw["hidden_states"].view(torch.uint8), codes.view(torch.uint8))
    same_scales = torch.equal(raw["hidden_states_scales"].view(torch.int32),
                              scales.float().view(torch.int32))
    ref = f32["hidden_states"]
    err = ((hs.float() - ref).abs().amax(dim=(1, 2)) / ref.abs().amax(dim=(1, 2))).max().item()
    if not (ok and same_codes and same_scales):
        print(f"  {name}: reader ok {ok}, codes equal {same_codes}, scales equal {same_scales}")
    return ok and same_codes and same_scales, err


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hsx", default="target/release/hsx")
    ap.add_argument("--config", default="config.toml")
    ap.add_argument("--input", default="tests/fixtures/prompts.jsonl")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {d: Path(tmp) / d for d in ("f32", "bf16", "fp8")}
        for dtype, out in dirs.items():
            extract(args.hsx, args.config, args.input, out, dtype)
        names = sorted(p.name for p in dirs["fp8"].glob("*.safetensors"))
        reader = FP8Transfer(dirs["fp8"])
        results = [check_file(n, dirs, reader) for n in names]
        good = sum(ok for ok, _ in results)
        worst = max(err for _, err in results)
        sizes = {d: sum(os.path.getsize(p) for p in out.glob("*.safetensors"))
                 for d, out in dirs.items()}
        tokens = sum(load_file(dirs["f32"] / n)["token_ids"].numel() for n in names)
    print(f"files {len(names)}, tokens {tokens}: {good}/{len(names)} load through "
          f"FP8Transfer.get_generated with codes and scales equal to "
          f"quantize_tensor_to_fp8(f32 states)")
    print(f"worst per-token error of the dequantized bf16 states, relative to the token's "
          f"amax: {worst:.4f}")
    print("bytes: " + ", ".join(f"{d} {b}" for d, b in sizes.items())
          + f"; fp8 / bf16 = {sizes['fp8'] / sizes['bf16']:.3f}")
    return 0 if good == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())

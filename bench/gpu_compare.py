#!/usr/bin/env python3
"""Compares two directories of hsx files written from the same prompts (e.g. CPU vs CUDA):
same file names, same token_ids, hidden_states within TOL of the largest value of each layer.

    python3 bench/gpu_compare.py DIR_A DIR_B [--tol 1e-4]

Exit 0 when every file agrees; prints the worst relative difference per file.
"""

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    fa = sorted(p.name for p in Path(args.a).glob("*.safetensors"))
    fb = sorted(p.name for p in Path(args.b).glob("*.safetensors"))
    if not fa or fa != fb:
        print(f"file lists differ: {len(fa)} vs {len(fb)}")
        return 1
    worst = 0.0
    for name in fa:
        a, b = load_file(f"{args.a}/{name}"), load_file(f"{args.b}/{name}")
        if not torch.equal(a["token_ids"], b["token_ids"]):
            print(f"{name}: token_ids differ")
            return 1
        ha, hb = a["hidden_states"].float(), b["hidden_states"].float()
        if ha.shape != hb.shape:
            print(f"{name}: shapes {ha.shape} vs {hb.shape}")
            return 1
        scale = ha.abs().amax(dim=(0, 2)) + 1e-30  # per layer
        rel = float(((ha - hb).abs().amax(dim=(0, 2)) / scale).max())
        worst = max(worst, rel)
        print(f"{name}: T={ha.shape[0]} K={ha.shape[1]} max rel diff {rel:.2e}")
    print(f"{len(fa)} files, worst {worst:.2e}, tol {args.tol:.0e}")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())

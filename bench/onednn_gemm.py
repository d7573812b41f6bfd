"""The peer of `gemm_peak --amx-share`: oneDNN's bf16 GEMM (torch's, on AMX where the CPU has
it; prepacked weights through `torch.ops.mkldnn._linear_pointwise`) at the dense bench
layer's shapes, 2048 rows, in rounds interleaved with hsx's own (`gemm_peak --amx-share 1`:
the tile peak probe, then hsx's dense-layer calls), so both meet the same minute of a VM
whose tile unit's rate swings. Prints one line per round and the medians of each one's share
of its round's peak.

    python bench/onednn_gemm.py ROUNDS [THREADS]   (from the repository root, after
    cargo build --release --examples)
"""

import re
import subprocess
import sys
import time

import torch

ROWS = 2048
# (name, k, n): q/k/v, o, the MLP's gate/up (as torch runs it, two GEMMs of the fused width)
# and down, as hsx's bench/amx_share.rs counts them.
SHAPES = [("qkv", 1024, 1536), ("o", 1024, 1024), ("gate_up", 1024, 5632), ("down", 2816, 1024)]


def onednn_rate(ops, reps=5):
    """GFLOP/s of the four GEMMs, each the best of `reps` calls."""
    total_t, total_f = 0.0, 0.0
    for flops, call in ops:
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t)
        total_t += best
        total_f += flops
    return total_f / total_t / 1e9


def hsx_round():
    """(2-thread tile peak, hsx's dense-layer calls) of one `gemm_peak --amx-share 1` round."""
    out = subprocess.run(
        ["target/release/examples/gemm_peak", "--amx-share", "1"], capture_output=True, text=True, check=True
    ).stdout
    peak = float(re.search(r"amx peak .*?, ([0-9.]+) on \d+", out).group(1))
    calls = float(re.search(r"dense-layer calls on \d+ threads: ([0-9.]+)", out).group(1))
    return peak, calls


def main():
    rounds = int(sys.argv[1])
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    ops = []
    for _, k, n in SHAPES:
        a, w = torch.randn(ROWS, k).bfloat16(), torch.randn(n, k).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, ROWS)
        ops.append((2 * ROWS * k * n, lambda a=a, p=packed: torch.ops.mkldnn._linear_pointwise(a, p, None, "none", [], "")))
    onednn_rate(ops, 2)  # warm-up
    shares = []
    for r in range(rounds):
        peak, hsx = hsx_round()
        onednn = onednn_rate(ops)
        shares.append((hsx / peak, onednn / peak))
        print(f"round {r}: peak {peak:.0f}, hsx {hsx:.0f} ({hsx / peak:.1%}), oneDNN {onednn:.0f} ({onednn / peak:.1%}) GFLOP/s")
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"median share of the round's peak: hsx {med([s[0] for s in shares]):.1%}, oneDNN {med([s[1] for s in shares]):.1%}")


if __name__ == "__main__":
    main()

"""The peer of `gemm_peak --amx-share`: oneDNN's bf16 GEMM (torch's, on AMX where the CPU has
it; prepacked weights through `torch.ops.mkldnn._linear_pointwise`) at the dense bench
layer's shapes, 2048 rows, in rounds interleaved with hsx's own (`gemm_peak --amx-share 1`:
the tile peak probe, then hsx's dense-layer calls), so both meet the same minute of a VM
whose tile unit's rate swings. Prints one line per round and the medians of each one's share
of its round's peak. Each round also times oneDNN alone on larger GEMMs (`LARGE`: its best
case, square and wide, compute-bound) and reports the best of them as a share of the same
peak: how near the tile peak Intel's own kernels come on this machine at any shape.

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
# (m, k, n) of oneDNN's larger GEMMs.
LARGE = [(4096, 4096, 4096), (2048, 4096, 4096), (8192, 2048, 2048), (256, 4096, 4096)]


def linear(m, k, n):
    """(flops, call) of an m × k by k × n bf16 GEMM on oneDNN, weights prepacked once."""
    a, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
    return 2 * m * k * n, lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")


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
    ops = [linear(ROWS, k, n) for _, k, n in SHAPES]
    large = [linear(*s) for s in LARGE]
    onednn_rate(ops + large, 1)  # warm-up
    shares = []
    for r in range(rounds):
        peak, hsx = hsx_round()
        onednn = onednn_rate(ops)
        best = max(onednn_rate([op], 3) for op in large)
        shares.append((hsx / peak, onednn / peak, best / peak))
        print(
            f"round {r}: peak {peak:.0f}, hsx {hsx:.0f} ({hsx / peak:.1%}), oneDNN {onednn:.0f} ({onednn / peak:.1%}), "
            f"oneDNN's best larger GEMM {best:.0f} ({best / peak:.1%}) GFLOP/s"
        )
    med = lambda xs: sorted(xs)[len(xs) // 2]
    hsx_s, dnn_s, best_s = (med([s[i] for s in shares]) for i in range(3))
    print(f"median share of the round's peak: hsx {hsx_s:.1%}, oneDNN {dnn_s:.1%}, oneDNN's best larger GEMM {best_s:.1%}")
    print(f"largest share seen: oneDNN's best larger GEMM {max(s[2] for s in shares):.1%}")


if __name__ == "__main__":
    main()

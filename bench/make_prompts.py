#!/usr/bin/env python3
"""The fixed benchmark prompt set, as hsx JSON lines ({"id", "token_ids"}).

    python3 bench/make_prompts.py OUT.jsonl [--tokens 100000] [--seed 5] [--vocab 32000]
                                  [--min-len 32] [--max-len 2048] [--count N]

Lengths are drawn log-uniform in [min-len, max-len] with a fixed seed until the total reaches
--tokens (the last prompt is kept whole), or exactly --count prompts. Token ids are uniform in
[3, vocab). Pure standard library: no torch needed (the CI smoke run uses it).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys


def make(tokens: int, seed: int, vocab: int, lo: int, hi: int, count: int | None) -> list[list[int]]:
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    total = 0
    while (count is None and total < tokens) or (count is not None and len(prompts) < count):
        n = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        n = max(lo, min(hi, n))
        prompts.append([rng.randrange(3, vocab) for _ in range(n)])
        total += n
    return prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--count", type=int, default=None, help="exactly this many prompts (overrides --tokens)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--min-len", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=2048)
    a = ap.parse_args()
    prompts = make(a.tokens, a.seed, a.vocab, a.min_len, a.max_len, a.count)
    with open(a.out, "w", newline="\n") as f:
        for i, ids in enumerate(prompts):
            f.write(json.dumps({"id": f"b{i:04d}", "token_ids": ids}, separators=(",", ":")) + "\n")
    total = sum(map(len, prompts))
    print(f"wrote {a.out}: {len(prompts)} prompts, {total} tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The peer: hidden-state extraction with Hugging Face transformers on the CPU.

    /work/venv/bin/python bench/peer_transformers.py --model DIR --prompts P.jsonl \
        --mode usual|best [--batch 4] [--threads 2] [--layers 2,4,5,8]

Modes:
  usual  transformers the way people run it: AutoModelForCausalLM (LM head and all),
         output_hidden_states=True, prompts in file order, padded (right) batches of --batch
         prompts with an attention mask.
  best   transformers at its best for this job: the base model (no LM head), prompts sorted by
         length and batched with --batch so padding is minimal, output_hidden_states=True.

Both: torch.set_num_threads(--threads), inference_mode, use_cache=False, sdpa attention, weights
in the checkpoint's dtype (bf16 stays bf16: torch's own bf16 CPU kernels). The captured layers
are sliced to each prompt's length and copied (as an extractor would before saving); no file is
written (in the peer's favour). One warm-up batch is run first and not timed.

With --max-seconds the run stops after the batch that crosses that time (bf16 on a CPU without
AVX512-BF16/AMX is very slow in torch), and tok/s is over the batches run: "usual" takes them in
file order (random lengths), "best" in a fixed shuffled order of its sorted batches, so both
sample the whole length mix.

Prints one JSON object: {"mode", "dtype", "tokens", "seconds", "tok_per_s", "padded_tokens",
"batches", "of_batches", "of_tokens", "threads", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--mode", choices=["usual", "best"], required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the GPU bench, bench/gpu.py)")
    ap.add_argument("--layers", default=None, help="layer ids to keep (default: EAGLE-3's 2,L/2,L-3,L)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop after the batch that crosses this time; tok/s is then over the batches run",
    )
    a = ap.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(a.threads))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()

    prompts = [json.loads(line)["token_ids"] for line in open(a.prompts) if line.strip()]
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype="auto", attn_implementation="sdpa")
    except ValueError:
        # Classes without SDPA (MiMo-V2-Flash: its sinks) run their eager attention.
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype="auto", attn_implementation="eager")
    model.to(a.device)
    model.eval()
    dtype = next(model.parameters()).dtype
    n_layers = model.config.num_hidden_layers
    layers = (
        [int(x) for x in a.layers.split(",")]
        if a.layers
        else [2, n_layers // 2, n_layers - 3, n_layers]
    )
    pad = model.config.pad_token_id or 0

    order = list(range(len(prompts)))
    if a.mode == "best":
        order.sort(key=lambda i: len(prompts[i]))
        net = model.model  # base model: no LM head
    else:
        net = model
    batches = [order[i : i + a.batch] for i in range(0, len(order), a.batch)]
    if a.mode == "best":
        # Length-sorted batches, run in a fixed shuffled order so that a time-capped run
        # (--max-seconds) samples every length, as "usual" does with the file's order.
        random.Random(0).shuffle(batches)

    def run(batch: list[int]) -> int:
        lens = [len(prompts[i]) for i in batch]
        width = max(lens)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, i in enumerate(batch):
            ids[r, : lens[r]] = torch.tensor(prompts[i])
            mask[r, : lens[r]] = 1
        ids, mask = ids.to(a.device), mask.to(a.device)
        out = net(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        kept = []
        for r, n in enumerate(lens):
            kept.append(torch.stack([hs[k][r, :n] for k in layers], dim=1).clone())
        if a.device != "cpu":
            # An extractor brings the rows to the host to save them; this also ends the
            # batch's asynchronous GPU work inside the timed loop.
            kept = [k.to("cpu") for k in kept]
        del kept
        return len(batch) * width

    with torch.inference_mode():
        warm = min(batches, key=lambda b: sum(len(prompts[i]) for i in b))
        run(warm)
        t0 = time.perf_counter()
        padded = tokens = done = 0
        for b in batches:
            padded += run(b)
            tokens += sum(len(prompts[i]) for i in b)
            done += 1
            if a.max_seconds is not None and time.perf_counter() - t0 > a.max_seconds:
                break
        dt = time.perf_counter() - t0
    print(
        json.dumps(
            dict(
                mode=a.mode,
                dtype=str(dtype).removeprefix("torch."),
                tokens=tokens,
                seconds=round(dt, 3),
                tok_per_s=round(tokens / dt, 1),
                padded_tokens=padded,
                batches=done,
                of_batches=len(batches),
                of_tokens=sum(map(len, prompts)),
                batch=a.batch,
                threads=torch.get_num_threads(),
                device=a.device,
                torch=torch.__version__,
                transformers=transformers.__version__,
            )
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The CUDA checks on a lent GPU machine, which has no Rust toolchain: the test binaries and hsx
# are built on the development machine and carried, packed by bench/gpu_pack.sh into
# gpu/bins.tar.xz (bench/README.md, "On a GPU").
#
#   bench/gpu_check.sh OUT_DIR [DEADLINE_S]
#   bench/gpu_check.sh OUT_DIR 0 profile    # only the profile below
#   bench/gpu_check.sh OUT_DIR 0 hybrid     # the Qwen3.5 hybrid bench row and its profile
#   bench/gpu_check.sh OUT_DIR 0 recurrent  # the chunked recurrences: tests, hybrid bench,
#                                           # A/B tensor-core vs f32 state passes, profile
#   bench/gpu_check.sh OUT_DIR 0 mamba      # the Nemotron-H (Mamba-2) bench row, A/B, profile
#   bench/gpu_check.sh OUT_DIR 0 moe        # the Qwen3-30B-A3B-shaped MoE bench row (16 layers)
#   bench/gpu_check.sh OUT_DIR 0 glm        # the GLM-4.5-Air-shaped MoE bench row (6 layers)
#   bench/gpu_check.sh OUT_DIR 0 stalls     # ncu's stall reasons of the GDN state pass
#   bench/gpu_check.sh OUT_DIR 540 tensor   # tensor-core vs f32 state passes in one call: tests,
#                                           # A/B (files, speed, ncu), parity, sanitizers
#
# Steps (each logged under OUT_DIR, one line each in OUT_DIR/summary.txt):
#   env      `hsx env`: the libraries and the device hsx sees
#   lib      the library's CUDA unit tests (NVRTC compile of every kernel, ptxas reports)
#   models   every CUDA parity test (tests/models: cuda_*, matrix::*::cuda) on the GPU
#   engine   the engine's device tests (device = "auto" runs on the GPU)
#   extract  the README's extract on the bundled model and its bf16 twin, CPU vs CUDA compared
#   memcheck compute-sanitizer memcheck (bf16 dense and hybrid, Mamba-2), racecheck (bf16 dense)
#   bench    bench/gpu.py (8B-shaped random model), only if DEADLINE_S leaves time for it
#   ab       the two attention kernels at the bench model's shape: files compared, speed
#   host     (profile mode) the runner's host work between steps, bench/step_host.rs
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [DEADLINE_S] [profile]}
deadline=${2:-0}
mode=${3:-all}
t0=$(date +%s)
mkdir -p "$out"
summary="$out/summary.txt"
step() { # name timeout_s command...
    local name=$1 limit=$2 s rc
    shift 2
    s=$(date +%s)
    timeout "$limit" "$@" >>"$out/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc $(($(date +%s) - s))s" | tee -a "$summary"
}
# Seconds left before DEADLINE_S.
left() { echo $((deadline - ($(date +%s) - t0))); }

tar xJf gpu/bins.tar.xz -C gpu || exit 1
# The test binaries name fixtures and hsx by the build machine's absolute paths.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
mkdir -p target/release && cp gpu/hsx target/release/hsx
# cuBLAS and NVRTC from the CUDA 13 wheels beside torch, or the toolkit.
libs=$(find /opt /usr/local -xdev \( -name 'libnvrtc.so.13*' -o -name 'libcublas.so.13*' \
    -o -name 'libcuda.so.1' \) 2>/dev/null | grep -v /compat/ | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
{ nvidia-smi; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } >"$out/env.log" 2>&1
step env 60 gpu/hsx env
grep -iE "cuda|device" "$out/env.log" | head -20

# A CUDA config for model dir $1 with layer ids $2 and max_model_len $3, output /tmp/$4, in
# /tmp/$4.toml; up to 64 requests of 8,192 tokens per step.
gpu_cfg() {
    printf '[model]\npath = "%s"\ndevice = "cuda"\n[engine]\nmax_num_batched_tokens = 8192\nmax_num_seqs = 64\nmax_model_len = %s\nnum_blocks = 8192\nlayer_ids = [%s]\n[output]\ndir = "/tmp/%s"\n' \
        "$1" "$3" "$2" "$4" >"/tmp/$4.toml"
}
# The README's config.toml for device $1, output dir $2, fixture model $3.
cfg() { sed -e "s|^device = .*|device = \"$1\"|" -e "s|^dir = .*|dir = \"$2\"|" \
    -e "s|^path = \"tests/fixtures/models/llama\"|path = \"$PWD/tests/fixtures/models/$3\"|" config.toml; }

# Where one 8,192-token step of a model spends its GPU time (ncu, per kernel), and the device
# memory of one 32,768-token prompt with 5 captured layers (the O(budget) capture bound).
#   profile WORK SHAPE PROFILE_LAYERS [LONG_LAYERS]    (no LONG_LAYERS: only the ncu profile)
profile() {
    local m=$1 shape=$2 prof_layers=$3 long_layers=${4:-} p
    [ -f $m/model/config.json ] || step profile 200 gpu/random_model $m/model --shape $shape
    local vocab
    vocab=$(python3 -c "import json; print(json.load(open('$m/model/config.json'))['vocab_size'])")
    for p in "p2 2 4096" "p32k 1 32768"; do
        set -- $p
        python3 bench/make_prompts.py /tmp/$1.jsonl --count $2 --vocab "$vocab" --min-len $3 \
            --max-len $3 >/dev/null
    done
    gpu_cfg $m/model "$prof_layers" 32768 prof
    gpu_cfg $m/model "${long_layers:-$prof_layers}" 32768 long
    [ -n "$long_layers" ] || { profile_ncu; return; }
    (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) \
        >/tmp/mem.txt 2>/dev/null &
    local poll=$!
    RUST_LOG=info HSX_BENCH_DISCARD_OUTPUT=1 step long 120 gpu/hsx extract --config /tmp/long.toml \
        --input /tmp/p32k.jsonl
    kill $poll
    echo "32k prompt, 5 layers: peak device memory $(sort -n /tmp/mem.txt | tail -1) MiB" |
        tee -a "$summary"
    grep -iE "memory|tokens/s" "$out/long.log" | tail -6
    profile_ncu
}
find_ncu() {
    command -v ncu >/dev/null ||
        PATH="$PATH:$(dirname "$(ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)")"
}
profile_ncu() {
    find_ncu
    HSX_BENCH_DISCARD_OUTPUT=1 step ncu 150 ncu --metrics gpu__time_duration.sum \
        --print-summary per-kernel gpu/hsx extract --config /tmp/prof.toml --input /tmp/p2.jsonl \
        --quiet
}
# The hybrid row: a 9B-class Qwen3.5 (Gated DeltaNet 3:1 gated attention, head dim 256), hsx
# and transformers on the GPU, then where one step's GPU time goes.
hybrid() {
    step hybrid 300 python3 bench/gpu.py --hsx gpu/hsx --random-model gpu/random_model \
        --work /tmp/hsx-q35 --shape qwen35_9b --tokens 30000 --long 16384 --peer-max-seconds 30
    tail -25 "$out/hybrid.log"
    profile /tmp/hsx-q35 qwen35_9b 2,16,29,32
}
# The hybrid kernels (chunked.cu's recurrences, chunked_mma.cu's tensor-core state passes, the
# tensor-core attention at head dim 256): their tests and the parity suite, the sanitizer on the
# hybrid fixtures and the kernel tests, the hybrid bench row with transformers (bf16: the
# tensor-core state passes), then the f32 state passes on the same prompts
# (HSX_CUDA_RECURRENT=chunked): files compared, speed; and where one step's GPU time goes.
recurrent() {
    local m=/tmp/hsx-q35 t="--test-threads 8 --nocapture" k
    step lib 120 gpu/libtests kernels::cuda $t
    grep -E "^test result|FAILED|panicked|vs token|cut at|hd 256" "$out/lib.log" | head -24
    step hybrid 300 python3 bench/gpu.py --hsx gpu/hsx --random-model gpu/random_model \
        --work $m --shape qwen35_9b --tokens 30000 --long 16384 --peer-max-seconds 30
    tail -16 "$out/hybrid.log"
    head -4 $m/prompts.jsonl >/tmp/p4.jsonl
    for k in new old; do
        gpu_cfg $m/model "2, 16, 29, 32" 16384 ab-$k
    done
    step ab 120 gpu/hsx extract --config /tmp/ab-new.toml --input /tmp/p4.jsonl --quiet
    HSX_CUDA_RECURRENT=chunked step ab 120 gpu/hsx extract \
        --config /tmp/ab-old.toml --input /tmp/p4.jsonl --quiet
    step ab 60 python3 bench/gpu_compare.py /tmp/ab-old /tmp/ab-new --tol 5e-2
    rm -rf /tmp/ab-old
    HSX_BENCH_DISCARD_OUTPUT=1 HSX_CUDA_RECURRENT=chunked step ab 120 gpu/hsx extract \
        --config /tmp/ab-old.toml --input $m/prompts.jsonl --quiet
    grep -E "tokens/s|worst" "$out/ab.log"
    step models 200 gpu/models cuda $t
    grep -E "^test result|FAILED|panicked|worst" "$out/models.log" | head -30
    for k in qwen3_5_bf16 nemotron_h; do
        cfg cuda /tmp/m-$k $k >/tmp/m-$k.toml
        step memcheck 100 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
            gpu/hsx extract --config /tmp/m-$k.toml --input tests/fixtures/prompts.jsonl
    done
    for k in attention_tests recurrent_chunked; do
        step memcheck 90 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
            gpu/libtests $k --test-threads 1
    done
    step memcheck 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
        gpu/libtests recurrent_chunked --test-threads 1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|test result" "$out/memcheck.log"
    profile $m qwen35_9b 2,16,29,32
}
# The Mamba-2 row: Nemotron-H-8B's geometry (random bf16 weights; EAGLE-3's layers 2, 26, 49,
# 52), hsx and transformers (as installed there: without mamba_ssm it runs its torch
# fallback, one prompt at a time: at 4 it asked for 112 GiB on an H200), then the f32 state
# pass on the same prompts (HSX_CUDA_RECURRENT=chunked, compute-only), and where one step's GPU
# time goes. The long prompt is 8,192 tokens, the model's max_position_embeddings.
mamba() {
    local m=/tmp/hsx-nh
    step mamba 300 python3 bench/gpu.py --hsx gpu/hsx --random-model gpu/random_model \
        --work $m --shape nemotronh_8b --tokens 30000 --long 8192 --layers 2,26,49,52 \
        --long-layers 2,13,26,39,52 --peer-batch 1 --peer-max-seconds 30
    tail -16 "$out/mamba.log"
    gpu_cfg $m/model "2, 26, 49, 52" 16384 nh-f32
    HSX_BENCH_DISCARD_OUTPUT=1 HSX_CUDA_RECURRENT=chunked step mamba 120 gpu/hsx extract \
        --config /tmp/nh-f32.toml --input $m/prompts.jsonl --quiet
    grep -E "tokens/s" "$out/mamba.log" | tail -2
    profile $m nemotronh_8b 2,26,49,52
}
# The MoE row: Qwen3-30B-A3B's geometry (128 experts of 768, 8 per token), its first 16 of 48
# layers (20 GB of random bf16 weights; all 48 would not fit the 64 GiB disk beside the rest),
# EAGLE-3-style layers 2, 8, 13, 16; hsx and transformers on the GPU. No ncu profile: hsx runs
# a cuBLAS GEMM pair per expert that got rows (~4,000 launches per step here), too many for
# ncu's replay in the time left.
moe() {
    local m=/tmp/hsx-moe
    step moe 540 python3 bench/gpu.py --hsx gpu/hsx --random-model gpu/random_model \
        --work $m --shape qwen3moe_30b --model-layers 16 --tokens 30000 --long 16384 \
        --layers 2,8,13,16 --long-layers 2,4,8,13,16 --peer-max-seconds 30
    tail -16 "$out/moe.log"
}
# GLM-4.5-Air's geometry (`random_model --shape glm45_air`: biased q/k/v, partial rotary, the
# grouped sigmoid router with its choice bias, a shared expert), its first 6 layers (layer 0
# dense; 5 MoE layers of 4.7 GB: 24 GB of random bf16 weights), layers 1, 3, 6; hsx and
# transformers on the GPU. No ncu profile, as for `moe`.
glm() {
    local m=/tmp/hsx-glm
    step glm 540 python3 bench/gpu.py --hsx gpu/hsx --random-model gpu/random_model \
        --work $m --shape glm45_air --model-layers 6 --tokens 30000 --long 16384 \
        --layers 1,3,6 --long-layers 1,3,6 --peer-max-seconds 30
    tail -16 "$out/glm.log"
}
# Where the Gated DeltaNet state pass stalls (gdn_chunk_state_mma for bf16 weights;
# gdn_chunk_state_f32 under HSX_CUDA_RECURRENT=chunked): ncu's throughput, occupancy,
# warp-state and memory sections over two of its launches in a 4-layer model of the hybrid
# bench's shape (two 4,096-token prompts in one step); the chunked tests first.
stalls() {
    local m=/tmp/hsx-q35-4
    step lib 120 gpu/libtests recurrent_chunked --test-threads 4 --nocapture
    grep -E "^test result|FAILED|panicked|chunked vs|cut at" "$out/lib.log"
    step stalls 90 gpu/random_model $m/model --shape qwen35_9b --layers 4
    python3 bench/make_prompts.py /tmp/p2.jsonl --count 2 --vocab 248320 --min-len 4096 \
        --max-len 4096 >/dev/null
    gpu_cfg $m/model "1, 4" 32768 stalls
    find_ncu
    HSX_BENCH_DISCARD_OUTPUT=1 step stalls 150 ncu -k regex:gdn_chunk_state -c 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        gpu/hsx extract --config /tmp/stalls.toml --input /tmp/p2.jsonl --quiet
}
# The tensor-core state passes against the f32 ones in one call (`gpu_check.sh OUT 540 tensor`):
# the CUDA unit tests, then per hybrid (an 8-layer Qwen3.5 9B slice, a 10-block Nemotron-H-8B
# slice: the full models' layer shapes) files of both compared, wall-clock A/B and the kernel
# times (ncu) of each state pass and of the intra-block output at 2 x 4,096 and 1 x 8,192
# tokens; then the parity suite and the sanitizers on the chunked tests, each skipped when the
# deadline would cut it.
timed() { # name limit command...: step, or a skip line when the deadline is nearer than limit
    local name=$1 limit=$2
    if [ "$(left)" -lt "$limit" ]; then
        echo "$name skipped: $(left)s left" | tee -a "$summary"
        return
    fi
    step "$@"
}
tensor_ab() { # NAME SHAPE BLOCKS LAYER_IDS
    local name=$1 shape=$2 n=$3 ids=$4 m=/tmp/hsx-slice-$1 vocab k p
    timed $name 100 gpu/random_model $m/model --shape $shape --layers $n
    vocab=$(python3 -c "import json; print(json.load(open('$m/model/config.json'))['vocab_size'])")
    for p in "p16 16 4096" "p2 2 4096" "p1 1 8192"; do
        set -- $p
        python3 bench/make_prompts.py /tmp/$name-$1.jsonl --count $2 --vocab "$vocab" \
            --min-len $3 --max-len $3 >/dev/null
    done
    head -4 /tmp/$name-p16.jsonl >/tmp/$name-p4.jsonl
    for k in tensor chunked; do
        gpu_cfg $m/model "$ids" 16384 $name-$k
        HSX_CUDA_RECURRENT=$k timed $name 60 gpu/hsx extract --config /tmp/$name-$k.toml \
            --input /tmp/$name-p4.jsonl --quiet
    done
    timed $name 60 python3 bench/gpu_compare.py /tmp/$name-chunked /tmp/$name-tensor --tol 5e-2
    rm -rf /tmp/$name-tensor /tmp/$name-chunked # (a present file would be skipped below)
    for k in tensor chunked tensor chunked; do
        HSX_CUDA_RECURRENT=$k HSX_BENCH_DISCARD_OUTPUT=1 timed $name 60 gpu/hsx extract \
            --config /tmp/$name-$k.toml --input /tmp/$name-p16.jsonl --quiet
    done
    grep -E "tokens/s|worst" "$out/$name.log"
    find_ncu
    for p in p2 p1; do
        for k in tensor chunked; do
            HSX_CUDA_RECURRENT=$k HSX_BENCH_DISCARD_OUTPUT=1 timed ncu-$name-$p 60 ncu \
                -k 'regex:chunk_(state|out)' -c 8 --metrics gpu__time_duration.sum \
                gpu/hsx extract --config /tmp/$name-$k.toml --input /tmp/$name-$p.jsonl --quiet
        done
        grep -E "chunk_(state|out)|duration" "$out/ncu-$name-$p.log" | head -40
    done
}
tensor() {
    local t="--test-threads 8 --nocapture"
    timed lib 120 gpu/libtests kernels::cuda $t
    grep -E "^test result|FAILED|panicked|vs token|cut at|tensor" "$out/lib.log" | head -24
    tensor_ab q35 qwen35_9b 8 "2, 5, 8"
    tensor_ab nh nemotronh_8b 10 "2, 6, 10"
    timed models 150 gpu/models cuda $t
    grep -E "^test result|FAILED|panicked|worst" "$out/models.log" | head -30
    timed memcheck 90 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
        gpu/libtests recurrent_chunked --test-threads 1
    timed memcheck 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
        gpu/libtests recurrent_chunked --test-threads 1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|test result" "$out/memcheck.log"
}
if [ "$mode" = tensor ]; then
    tensor
    cat "$summary"
    exit 0
fi
if [ "$mode" = stalls ]; then
    stalls
    cat "$summary"
    exit 0
fi
if [ "$mode" = mamba ]; then
    mamba
    cat "$summary"
    exit 0
fi
if [ "$mode" = recurrent ]; then
    recurrent
    cat "$summary"
    exit 0
fi
if [ "$mode" = moe ]; then
    moe
    cat "$summary"
    exit 0
fi
if [ "$mode" = glm ]; then
    glm
    cat "$summary"
    exit 0
fi
if [ "$mode" = hybrid ]; then
    hybrid
    cat "$summary"
    exit 0
fi
if [ "$mode" = profile ]; then
    # The runner's host work between steps on this machine's cores (bench/step_host.rs).
    step host 120 gpu/step_host --requests 4 --steps 12
    grep "runner host time" "$out/host.log"
    profile /tmp/hsx-gpu llama8b 2,16,29,32 2,8,16,24,32
    cat "$summary"
    exit 0
fi

tests="--test-threads 8 --nocapture"
step lib 240 gpu/libtests kernels::cuda env_report $tests
step models 420 gpu/models cuda $tests
step engine 120 gpu/engine cuda_device $tests
for f in lib models engine; do
    grep -E "^test result|FAILED|panicked|skipping" "$out/$f.log" | sort | uniq -c | head -20
done

# The README's extract, CPU and CUDA, files compared.
# f32 files within 1e-4 of the CPU's; bf16 (the tensor-core attention) within 3e-2.
for m in llama llama_bf16; do
    for dev in cpu cuda; do
        cfg $dev /tmp/x-$m-$dev $m >/tmp/x-$m-$dev.toml
        step extract 120 gpu/hsx extract --config /tmp/x-$m-$dev.toml \
            --input tests/fixtures/prompts.jsonl
    done
done
step extract 60 python3 bench/gpu_compare.py /tmp/x-llama-cpu /tmp/x-llama-cuda
step extract 60 python3 bench/gpu_compare.py /tmp/x-llama_bf16-cpu /tmp/x-llama_bf16-cuda --tol 3e-2

for m in llama_bf16 qwen3_5_bf16 nemotron_h; do
    cfg cuda /tmp/m-$m $m >/tmp/m-$m.toml
    step memcheck 100 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
        gpu/hsx extract --config /tmp/m-$m.toml --input tests/fixtures/prompts.jsonl
done
rm -rf /tmp/m-llama_bf16
step memcheck 100 compute-sanitizer --tool racecheck --error-exitcode 9 \
    gpu/hsx extract --config /tmp/m-llama_bf16.toml --input tests/fixtures/prompts.jsonl
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard" "$out/memcheck.log" | sort | uniq -c | head

# The two attention kernels at the bench model's shape (head dim 128): 8 bench prompts written
# with each and compared, then the whole prompt set compute-only with the CUDA-core kernel
# (bench.log has the tensor-core one's).
attention_ab() {
    local m=/tmp/hsx-gpu
    head -8 $m/prompts.jsonl >/tmp/p8.jsonl
    for k in mma simt; do
        gpu_cfg $m/model "2, 16, 29, 32" 4096 ab-$k
    done
    step ab 120 gpu/hsx extract --config /tmp/ab-mma.toml --input /tmp/p8.jsonl --quiet
    HSX_CUDA_ATTENTION=simt step ab 120 gpu/hsx extract --config /tmp/ab-simt.toml \
        --input /tmp/p8.jsonl --quiet
    step ab 120 python3 bench/gpu_compare.py /tmp/ab-simt /tmp/ab-mma --tol 5e-2
    HSX_BENCH_DISCARD_OUTPUT=1 HSX_CUDA_ATTENTION=simt step ab 200 gpu/hsx extract \
        --config /tmp/ab-simt.toml --input $m/prompts.jsonl --quiet
    grep -E "tokens/s|worst" "$out/ab.log"
}

secs=$(left)
if [ "$secs" -gt 150 ]; then
    step bench $((secs - 10)) python3 bench/gpu.py --hsx gpu/hsx --random-model gpu/random_model \
        --work /tmp/hsx-gpu --tokens 100000 --long 16384
    tail -25 "$out/bench.log"
    attention_ab
else
    echo "bench skipped: ${secs}s left" | tee -a "$summary"
fi
cat "$summary"

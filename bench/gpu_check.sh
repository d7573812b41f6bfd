#!/usr/bin/env bash
# The CUDA checks on a lent GPU machine, which has no Rust toolchain: the test binaries and hsx
# are built on the development machine and carried, packed by bench/gpu_pack.sh into
# gpu/bins.tar.xz (bench/README.md, "On a GPU").
#
#   bench/gpu_check.sh OUT_DIR [DEADLINE_S]
#   bench/gpu_check.sh OUT_DIR 0 profile    # only the profile below
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

# Where one 8,192-token step of the bench model spends its GPU time (ncu, per kernel), and the
# device memory of one 32,768-token prompt with 5 captured layers (the O(budget) capture bound).
profile() {
    local m=/tmp/hsx-gpu p
    [ -f $m/model/config.json ] || step profile 120 gpu/random_model $m/model --shape llama8b
    local vocab
    vocab=$(python3 -c "import json; print(json.load(open('$m/model/config.json'))['vocab_size'])")
    for p in "p2 2 4096" "p32k 1 32768"; do
        set -- $p
        python3 bench/make_prompts.py /tmp/$1.jsonl --count $2 --vocab "$vocab" --min-len $3 \
            --max-len $3 >/dev/null
    done
    for p in "prof 2,16,29,32" "long 2,8,16,24,32"; do
        set -- $p
        printf '[model]\npath = "%s"\ndevice = "cuda"\n[engine]\nmax_num_batched_tokens = 8192\nmax_model_len = 32768\nnum_blocks = 8192\nlayer_ids = [%s]\n[output]\ndir = "/tmp/o-%s"\n' \
            "$m/model" "$2" "$1" >/tmp/$1.toml
    done
    (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) \
        >/tmp/mem.txt 2>/dev/null &
    local poll=$!
    RUST_LOG=info HSX_BENCH_DISCARD_OUTPUT=1 step long 120 gpu/hsx extract --config /tmp/long.toml \
        --input /tmp/p32k.jsonl
    kill $poll
    echo "32k prompt, 5 layers: peak device memory $(sort -n /tmp/mem.txt | tail -1) MiB" |
        tee -a "$summary"
    grep -iE "memory|tokens/s" "$out/long.log" | tail -6
    command -v ncu >/dev/null ||
        PATH="$PATH:$(dirname "$(ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)")"
    HSX_BENCH_DISCARD_OUTPUT=1 step ncu 200 ncu --metrics gpu__time_duration.sum \
        --print-summary per-kernel gpu/hsx extract --config /tmp/prof.toml --input /tmp/p2.jsonl \
        --quiet
}
if [ "$mode" = profile ]; then
    profile
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
cfg() { sed -e "s|^device = .*|device = \"$1\"|" -e "s|^dir = .*|dir = \"$2\"|" \
    -e "s|^path = \"tests/fixtures/models/llama\"|path = \"$PWD/tests/fixtures/models/$3\"|" config.toml; }
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
        printf '[model]\npath = "%s"\ndevice = "cuda"\n[engine]\nmax_num_batched_tokens = 8192\nmax_num_seqs = 64\nmax_model_len = 4096\nnum_blocks = 8192\nlayer_ids = [2, 16, 29, 32]\n[output]\ndir = "/tmp/ab-%s"\n' \
            "$m/model" $k >/tmp/ab-$k.toml
    done
    step ab 120 gpu/hsx extract --config /tmp/ab-mma.toml --input /tmp/p8.jsonl --quiet
    HSX_CUDA_ATTENTION=simt step ab 120 gpu/hsx extract --config /tmp/ab-simt.toml \
        --input /tmp/p8.jsonl --quiet
    step ab 120 python3 bench/gpu_compare.py /tmp/ab-simt /tmp/ab-mma --tol 5e-2
    HSX_BENCH_DISCARD_OUTPUT=1 HSX_CUDA_ATTENTION=simt step ab 200 gpu/hsx extract \
        --config /tmp/ab-simt.toml --input $m/prompts.jsonl --quiet
    grep -E "tokens/s|worst" "$out/ab.log"
}

left=$((deadline - ($(date +%s) - t0)))
if [ "$left" -gt 150 ]; then
    step bench $((left - 10)) python3 bench/gpu.py --hsx gpu/hsx --random-model gpu/random_model \
        --work /tmp/hsx-gpu --tokens 100000 --long 16384
    tail -25 "$out/bench.log"
    attention_ab
else
    echo "bench skipped: ${left}s left" | tee -a "$summary"
fi
cat "$summary"

#!/usr/bin/env bash
# Builds what bench/gpu_check.sh runs on a GPU machine (which has no Rust toolchain) and packs it
# into gpu/bins.tar.xz: the library's, tests/models' and tests/engine's test binaries, hsx and the
# random_model and step_host examples, all with `--features cuda`, stripped (~13 MB packed).
#
#   bench/gpu_pack.sh
#
# Then carry `gpu` to the GPU machine and run `bench/gpu_check.sh OUT_DIR 420` there. gpu/ is
# kept out of git (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/gpu/' .git/info/exclude 2>/dev/null || echo '/gpu/' >>.git/info/exclude
cargo build --release --features cuda --bin hsx --example random_model --example step_host
# The test binaries' paths, from cargo's own report of what it built.
bins=$(cargo test --release --features cuda --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        name = "libtests" if t["kind"] == ["lib"] else t["name"]
        if name in ("libtests", "models", "engine"):
            print(name, m["executable"])
')
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
while read -r name path; do
    strip --strip-all -o "$stage/$name" "$path"
done <<<"$bins"
strip --strip-all -o "$stage/hsx" target/release/hsx
strip --strip-all -o "$stage/random_model" target/release/examples/random_model
strip --strip-all -o "$stage/step_host" target/release/examples/step_host
for f in libtests models engine hsx random_model step_host; do
    test -x "$stage/$f" || { echo "missing $f" >&2; exit 1; }
done
mkdir -p gpu
tar cJf gpu/bins.tar.xz -C "$stage" libtests models engine hsx random_model step_host
ls -l gpu/bins.tar.xz

#!/usr/bin/env bash
# The benchmark driver (bench/README.md): hsx vs transformers, one table.
#   bench/run.sh                      # full run (~100k tokens; needs /work/venv with torch)
#   bench/run.sh --tokens 20000       # quicker
#   bench/run.sh --smoke              # CI-sized: tiny fixture models, no torch
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/run.py "$@"

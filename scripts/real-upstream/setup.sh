#!/usr/bin/env bash
# setup.sh — prepare a real llama.cpp upstream for Tropa's end-to-end check.
#
#  1. installs node-llama-cpp (with its prebuilt linux-x64 CPU binary, shipped
#     inside the npm package @node-llama-cpp/linux-x64) into a throw-away folder,
#     <repo>/.real-upstream/node_modules, so the project's package.json and
#     bun.lock are never touched;
#  2. generates the tiny random-weight GGUF model into .real-upstream/tiny.gguf.
#
# Everything it writes lives under .real-upstream/ (add it to .gitignore; it is
# also excluded through .real-upstream/.gitignore, written below).
#
# Env: REAL_UPSTREAM_DIR (default <repo>/.real-upstream), NLC_VERSION (3.22.1),
#      MODEL_SEED (42), FORCE=1 to reinstall.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="${REAL_UPSTREAM_DIR:-$repo/.real-upstream}"
ver="${NLC_VERSION:-3.22.1}"
seed="${MODEL_SEED:-42}"
bun="${BUN:-bun}"

mkdir -p "$dir"
# keep the whole folder out of git even if the repo's .gitignore lacks it
printf '*\n' > "$dir/.gitignore"

now_ms() { date +%s%3N; }

t0=$(now_ms)
if [[ "${FORCE:-0}" == 1 || ! -f "$dir/node_modules/node-llama-cpp/package.json" ||
      ! -d "$dir/node_modules/@node-llama-cpp/linux-x64/bins" ]]; then
  # --prefix keeps the install out of the project; a package.json there makes
  # npm treat $dir as its own tiny project.
  [[ -f "$dir/package.json" ]] || printf '{"name":"tropa-real-upstream","private":true}\n' > "$dir/package.json"
  # NODE_LLAMA_CPP_SKIP_DOWNLOAD: never try to fetch/build llama.cpp (no network here);
  # --omit=optional: skip the CUDA/Vulkan binary packages, take linux-x64 explicitly.
  NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix "$dir" \
    "node-llama-cpp@$ver" "@node-llama-cpp/linux-x64@$ver" \
    --omit=optional --no-audit --no-fund --loglevel=error
  echo "setup: installed node-llama-cpp@$ver in $(( $(now_ms) - t0 )) ms"
else
  echo "setup: node-llama-cpp already installed in $dir (FORCE=1 to reinstall)"
fi

t1=$(now_ms)
"$bun" "$here/make-gguf.ts" --out "$dir/tiny.gguf" --seed "$seed"
echo "setup: model generated in $(( $(now_ms) - t1 )) ms (incl. bun start-up)"

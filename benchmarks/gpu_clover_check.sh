#!/usr/bin/env bash
# Clover's path on one NVIDIA H200, in one 10-minute call of the device tool (docs/speed.md): build llama-server
# for CUDA sm_90 from the pinned llama.cpp with its qwen35moe name row called clover_moe (the test runtime's
# recipe, clover_local/testing/runtime.py), install it as runtime b99999, write the Clover-shaped GGUF under
# clover_moe (19.7 GiB, random weights, the real shape), then for a card held to 8, 12 and 16 GiB free (a process
# holds the rest with plain cudaMalloc) run benchmarks/bench_clover_full.py: the plan's -ngl/--n-cpu-moe (the decided
# launch) beside upstream's defaults, llama.cpp's own --fit on, and --n-cpu-moe around the plan's value.
#
# The device machine reaches no network, so what it needs travels in .gpu/ (in .gitignore; carried):
#
#   benchmarks/gpu_clover_check.sh prepare      # here: the patched llama.cpp source (~20 MB), gguf and platformdirs wheels
#   device run: carry [".gpu"], timeout_s 600, command:
#     PYTHONUNBUFFERED=1 benchmarks/gpu_clover_check.sh 2>&1 | tee $OUT/log
#
# Every phase checks the time left (BUDGET_S, default 570 s from the start): a card that would not finish is
# skipped and said so; what was measured is in $OUT (bench-<N>G.json, timings.txt) whatever happens. Knobs:
# CARDS="8 12 16", NCMOE="around:4", BUDGET_S, JOBS (default: every core). Nothing here runs on this machine
# except `prepare`: no GPU, and no room for the 19.7 GiB model beside others' work.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU="$ROOT/.gpu"
cd "$ROOT"

prepare() {
  local py="${PYTHON:-$ROOT/.venv/bin/python}"
  [ -x "$py" ] || py=python3
  mkdir -p "$GPU/whl"  # git-ignored (.gitignore): it travels only as a carried path
  PYTHONPATH="$ROOT:$ROOT/scripts" "$py" - "$GPU" <<'EOF' || exit 1
import io, sys, tarfile
from pathlib import Path
from llama_sdist import kept_tree, pinned_version
from clover_local import settings
from clover_local.testing.runtime import patch_arch_source

out = Path(sys.argv[1])
src = kept_tree(settings.cache_dir(), pinned_version(), "cpu").src  # the pinned source, as build-llama-server keeps it
skip = {"models", "docs", "media", "benches", "gguf-py", ".github", ".devops", "conversion", "tests", "examples"}
skip_deep = {"ggml/src/ggml-opencl", "ggml/src/ggml-sycl", "ggml/src/ggml-hexagon", "ggml/src/ggml-vulkan"}
arch = patch_arch_source((src / "src" / "llama-arch.cpp").read_text(encoding="utf-8"))
(out / "llama-arch.cpp").write_text(arch, encoding="utf-8")
(out / "arg.cpp").write_bytes((src / "common" / "arg.cpp").read_bytes())

def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    rel = info.name.split("/", 1)[1] if "/" in info.name else ""
    top = rel.split("/", 1)[0]
    if top in skip or any(rel == d or rel.startswith(d + "/") for d in skip_deep):
        return None
    return None if rel == "src/llama-arch.cpp" else info  # the patched one is added instead

with tarfile.open(out / "llama-src.tar.xz", "w:xz", preset=6) as tar:
    tar.add(src, arcname="llama.cpp", filter=keep)
    data = arch.encode()
    info = tarfile.TarInfo("llama.cpp/src/llama-arch.cpp")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))  # with the clover_moe row
print(f"prepared {out}/llama-src.tar.xz from {src}")
EOF
  local gguf_v platformdirs_v
  gguf_v="$("$py" -c 'import importlib.metadata as m; print(m.version("gguf"))')"
  platformdirs_v="$("$py" -c 'import importlib.metadata as m; print(m.version("platformdirs"))')"
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$GPU/whl" "gguf==$gguf_v" "platformdirs==$platformdirs_v"
  du -sh "$GPU" "$GPU"/*
  local kib
  kib="$(du -sk "$GPU" | cut -f1)"
  [ "$kib" -lt 61440 ] || { echo "prepare: .gpu is ${kib} KiB; the device tool carries 64 MiB in all" >&2; exit 1; }
}

if [ "${1:-}" = "prepare" ]; then
  prepare
  exit
fi

# -- on the device machine ---------------------------------------------------------------------------------------
BUDGET_S="${BUDGET_S:-570}"
CARDS="${CARDS:-8 12 16}"
NCMOE="${NCMOE:-around:4}"
JOBS="${JOBS:-$(nproc)}"
OUT="${OUT:-/tmp/gpu-clover-out}"
WORK=/tmp/gpu-clover
MODEL="$WORK/clover-shaped-clover_moe.gguf"
RT="$WORK/runtimes/b99999"
mkdir -p "$OUT" "$WORK" "$RT/bin"
left() { echo $((BUDGET_S - SECONDS)); }
stamp() { echo "$(date +%T) +${SECONDS}s $*" | tee -a "$OUT/timings.txt"; }
[ -f "$GPU/llama-src.tar.xz" ] || { echo "no .gpu/llama-src.tar.xz: run benchmarks/gpu_clover_check.sh prepare here and carry .gpu" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv | tee "$OUT/gpu.txt"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$GPU"/whl/*.whl || exit 1
export PYTHONPATH="$ROOT:/tmp/site"
export HF_HUB_OFFLINE=1 CLOVER_RUNTIMES_DIR="$WORK/runtimes" CLOVER_CACHE_DIR="$WORK/cache" \
  CLOVER_DATA_DIR="$WORK/data" CLOVER_CONFIG_DIR="$WORK/config"

# The model, written while llama-server builds (disk and compilers do not compete much). A second call on the
# still-warm machine finds both and goes straight to the cards.
writer=""
if [ ! -f "$MODEL.done" ]; then
  stamp "writing the Clover-shaped GGUF (clover_moe)"
  (python3 -c "from pathlib import Path; from clover_local.testing.clover_shaped import write_clover_shaped; \
write_clover_shaped(Path('$MODEL'), arch='clover_moe')" >"$OUT/model.log" 2>&1 && touch "$MODEL.done") &
  writer=$!
fi

if [ ! -x "$RT/bin/llama-server" ]; then
  stamp "building llama-server (CUDA sm_90, -j $JOBS)"
  rm -rf "$WORK/src" && mkdir -p "$WORK/src" && tar -xJf "$GPU/llama-src.tar.xz" -C "$WORK/src" || exit 1
  cmake -S "$WORK/src/llama.cpp" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$OUT/cmake.log" 2>&1 \
    || { tail -40 "$OUT/cmake.log"; exit 1; }
  cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$OUT/build.log" 2>&1 \
    || { tail -60 "$OUT/build.log"; exit 1; }
  stamp "built"
  cp "$WORK/build/bin/llama-server" "$RT/bin/" && cp "$GPU/llama-arch.cpp" "$GPU/arg.cpp" "$RT/"
  python3 -c "import json,time; json.dump({'tag':'b99999','backend':'cuda','origin':'source','server':'bin/llama-server',\
  'asset':None,'sha256':None,'installed':time.strftime('%Y-%m-%dT%H:%M:%S')}, open('$RT/runtime.json','w'))"
fi
"$RT/bin/llama-server" --version 2>&1 | tail -2 | tee -a "$OUT/gpu.txt"

if [ -n "$writer" ]; then
  wait "$writer" || { cat "$OUT/model.log"; exit 1; }
  stamp "model written: $(tail -1 "$OUT/model.log")"
fi
cat "$MODEL" >/dev/null  # into the page cache once, so every load below reads memory, not disk

hold() {  # hold all but $1 GiB of the card with plain allocations until killed
  python3 - "$1" <<'EOF' &
import sys, time, torch
keep = float(sys.argv[1]) * 2**30
free, _total = torch.cuda.mem_get_info()
held = torch.empty(max(int(free - keep), 0), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(f"holding {held.numel() / 2**30:.1f} GiB; free now {torch.cuda.mem_get_info()[0] / 2**30:.2f} GiB", flush=True)
open("/tmp/gpu-clover-held", "w").close()
time.sleep(10**6)  # until killed
EOF
  holder=$!
  for _ in $(seq 120); do [ -f /tmp/gpu-clover-held ] && return 0; sleep 0.5; done
  echo "the holder did not start" >&2
  return 1
}

set -- $CARDS
while [ $# -gt 0 ]; do
  gib="$1"
  shift
  share=$(($(left) / ($# + 1)))
  if [ "$share" -lt 60 ]; then
    stamp "card ${gib} GiB: skipped, ${share}s would be left for it"
    continue
  fi
  rm -f /tmp/gpu-clover-held
  hold "$gib" || continue
  stamp "card ${gib} GiB free: benchmark (${share}s)"
  python3 benchmarks/bench_clover_full.py --model "$MODEL" --preset clover-35b-a3b --grid none \
    --fit-on --ncmoe "$NCMOE" --prompts 500,4000 --decode 64 --turns 3 --ready-timeout-s 240 \
    --deadline-s $((share - 45)) --json "$OUT/bench-${gib}G.json" >"$OUT/bench-${gib}G.txt" 2>&1
  cat "$OUT/bench-${gib}G.txt"
  kill "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
done
stamp "done"

#!/usr/bin/env bash
# The GPU call: on a machine with a CUDA GPU, record what only it can show, then execute every
# chapter and lab on it at CI scale. Prepared here with `make gpu-prepare`, run there as
#
#     bash scripts/gpu_pass.sh [BUDGET_S] [OUT]
#
# It uses that machine's own python3 and torch with PYTHONPATH=src (nothing is installed), the
# pruned bitsandbytes in .gpu/site, and the commit written to .gpu/source.env. BUDGET_S (default
# 540) is the whole call's: `memlab record` gets MEMLAB_RECORD_SHARE of it (default 0.65), the
# notebooks the rest; each stops itself at its share. OUT (default $OUT, else /tmp/gpu-pass)
# receives at most four files: preflight.txt, gpu-pass.tar.gz (records, summary, logs),
# notebooks.json and notebook-logs.tar.gz. MODE=record or MODE=notebooks runs one half only.
# The tests rehearse it on a CPU with MEMLAB_PASS_DEVICE=cpu, MEMLAB_PASS_SCALE=ci,
# MEMLAB_PASS_ONLY (experiments) and MEMLAB_PASS_NOTEBOOKS (notebooks or folders).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-540}
OUT=${2:-${OUT:-/tmp/gpu-pass}}
MODE=${MODE:-all}
SHARE=${MEMLAB_RECORD_SHARE:-0.65}
PY=${PYTHON:-python3}
WORK=${MEMLAB_GPU_WORK:-/tmp/memlab-gpu-work}
DEVICE=${MEMLAB_PASS_DEVICE:-cuda}
SCALE=${MEMLAB_PASS_SCALE:-full}
ONLY=(); [ -n "${MEMLAB_PASS_ONLY:-}" ] && ONLY=(--only "$MEMLAB_PASS_ONLY")
read -r -a NOTEBOOKS <<< "${MEMLAB_PASS_NOTEBOOKS:-chapters labs appendix}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD/src:$PWD/.gpu/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
[ -f .gpu/source.env ] && { set -a; . .gpu/source.env; set +a; }
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }

# Preflight: versions, the GPU, bitsandbytes' CUDA library. No GPU: stop here, in one line.
"$PY" -m memlab env --packages 2>&1 | tee "$OUT/preflight.txt"
if [ "$DEVICE" = cuda ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_pass: error: torch sees no CUDA GPU on this machine" | tee -a "$OUT/preflight.txt" >&2
  exit 2
fi
# memlab needs torch 2.5 or later (its memory tracker); say so in one line, before any work.
if ! "$PY" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 5) else 1)'; then
  echo "gpu_pass: error: torch $("$PY" -c 'import torch; print(torch.__version__)') here; memlab needs 2.5 or later" | tee -a "$OUT/preflight.txt" >&2
  exit 2
fi

if [ "$MODE" != notebooks ]; then
  record_budget=$("$PY" -c "print(int($(left) * ($SHARE if '$MODE' == 'all' else 1)))")
  echo "== memlab record, $record_budget s"
  "$PY" -m memlab record --device "$DEVICE" --scale "$SCALE" --budget "$record_budget" \
      --skip-recorded "${ONLY[@]}" --out "$WORK/pass" --archive "$OUT/gpu-pass.tar.gz" \
      --archive-limit 15000000  # a file comes back only under 16 MiB
fi

if [ "$MODE" != record ]; then
  nb_budget=$(( $(left) - 5 ))
  echo "== notebooks on $DEVICE at CI scale, $nb_budget s"
  export MEMLAB_CACHE_DIR="$WORK/cache"  # the appendix reuses what the chapters ran, as in the book
  skip=(); [ -f "results/_notebooks/$DEVICE.json" ] && skip=(--skip-done "results/_notebooks/$DEVICE.json")
  "$PY" -m memlab.nbexec "${NOTEBOOKS[@]}" --device "$DEVICE" --scale ci --timeout 300 \
      --budget "$nb_budget" --report "$OUT/notebooks.json" --logs "$WORK/notebooks" "${skip[@]}"
  tar -czf "$OUT/notebook-logs.tar.gz" -C "$WORK" notebooks
fi
echo "gpu_pass: done in $(( $(date +%s) - start )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"

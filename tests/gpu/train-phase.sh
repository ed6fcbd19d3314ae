#!/usr/bin/env bash
# The training phase of the GPU run (docs/gpu.md, "Training on the GPU machine"):
#   bash tests/gpu/train-phase.sh OUTDIR SECONDS [scratch|shipped]
# Trains the chosen recipe (tools/configs/camvid-mita-xseq-skips-paste.json:
# the cross-sequence fold, validated on 0006R0, full frames: on a GPU time is
# not what limits the crop) for about SECONDS in all on
# whatever device PyTorch sees (CUDA: bf16 autocast, channels-last,
# DataLoader workers), from scratch or (`shipped`) from
# assets/models/camvid-mita.safetensors, with the cosine schedule planned to
# end within the budget, validating on the held-out sequence every 5 epochs
# and at the end; then exports the final weights (EMA; not the best
# validation epoch, which would pick on the held-out set) as F16. Leaves
# OUTDIR/last.pt, OUTDIR/model.safetensors, OUTDIR/log.txt, OUTDIR/train.out
# and exits 0, or exits non-zero with the reason on the last line.
# Data: ../shared/data/camvid when present, else the carried pack gpu-data/
# (tools/pack_data.py). Overrides (tests, other recipes): MS_TRAIN_CONFIG,
# MS_TRAIN_DATA, MS_TRAIN_HOLDOUT (a sequence, or "none" for the plain
# train/val lists: the final train+val model), MS_TRAIN_ARGS (more train.py
# arguments, e.g. "--val-every 10" or "--amp bf16").
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
if [ $# -lt 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$2" -lt 5 ]; then
    echo "usage: $0 OUTDIR SECONDS(>=5) [scratch|shipped]" >&2
    exit 2
fi
OUT=$1
SECS=$2
INIT=${3:-scratch}
case "$INIT" in
scratch) INIT_ARGS=() ;;
shipped) INIT_ARGS=(--init-model "$ROOT/assets/models/camvid-mita.safetensors") ;;
*) echo "train-phase: third argument: scratch or shipped, got '$INIT'" >&2; exit 2 ;;
esac

mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)

PY=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch, numpy, PIL" 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "train-phase: no python3 with torch, numpy and PIL" >&2; exit 1; }

DATA=${MS_TRAIN_DATA:-}
if [ -z "$DATA" ]; then
    for d in "$ROOT/../shared/data/camvid" "$ROOT/gpu-data"; do
        [ -f "$d/train.txt" ] && { DATA=$d; break; }
    done
fi
[ -n "$DATA" ] || { echo "train-phase: no data: neither ../shared/data/camvid nor gpu-data/ (tools/pack_data.py; carry it)" >&2; exit 1; }
CONFIG=${MS_TRAIN_CONFIG:-$ROOT/tools/configs/camvid-mita-xseq-skips-paste.json}
HOLDOUT=${MS_TRAIN_HOLDOUT:-0006R0}

# What the budget leaves after training: interpreter start-up, the final
# checkpoint and the export (a few seconds for the default model).
RESERVE=$((15 + SECS * 3 / 100))
[ $RESERVE -gt $((SECS / 4)) ] && RESERVE=$((SECS / 4))
TRAIN_SECS=$((SECS - RESERVE))

echo "train-phase: $(date -u +%FT%TZ) data $DATA, config $CONFIG, holdout $HOLDOUT, init $INIT, budget ${SECS}s (training ${TRAIN_SECS}s)" | tee "$OUT/train.out"
# shellcheck disable=SC2086
"$PY" "$ROOT/tools/train.py" --config "$CONFIG" --out "$OUT" --data-root "$DATA" --holdout "$HOLDOUT" \
    --epochs 100000 --time-budget "$TRAIN_SECS" --val-every 5 "${INIT_ARGS[@]}" ${MS_TRAIN_ARGS:-} \
    >>"$OUT/train.out" 2>&1
rc=$?
if [ $rc -ne 0 ] || [ ! -f "$OUT/last.pt" ]; then
    tail -5 "$OUT/train.out" >&2
    echo "train-phase: training failed (exit $rc); see $OUT/train.out" >&2
    exit 1
fi
"$PY" "$ROOT/tools/export.py" "$OUT/last.pt" "$OUT/model.safetensors" --dtype F16 >>"$OUT/train.out" 2>&1 || {
    tail -5 "$OUT/train.out" >&2
    echo "train-phase: export failed; see $OUT/train.out" >&2
    exit 1
}
grep -E '^epoch ' "$OUT/log.txt" | tail -1
echo "train-phase: done in $(($(date +%s) - T0))s: $OUT/last.pt, $OUT/model.safetensors" | tee -a "$OUT/train.out"

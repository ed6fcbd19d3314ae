# Sourced by the e2e_*.sh tests (not matched by their glob): finds the program, a small fixture model and
# Python with PIL + numpy (exit 77, skipped, without them), makes a temp
# folder to work in, and defines the pass/fail counters.
# Needs $MS_BIN (the program); the model is $MS_TEST_MODEL, else the first
# tests/fixtures/*.model.safetensors. Sets BIN FIX PY HELPER MODEL T.
BIN=${MS_BIN:?MS_BIN must name the mitaseg binary}
FIX=${MS_FIXTURES:-$(dirname "$0")/fixtures}
PY=${MS_PYTHON:-/usr/bin/python3}
HELPER=$(cd "$(dirname "$0")" && pwd)/e2e_images.py
MODEL=${MS_TEST_MODEL:-}
if [ -z "$MODEL" ]; then
    for m in "$FIX"/tiny.model.safetensors "$FIX"/mita_d.model.safetensors "$FIX"/*.model.safetensors; do
        [ -f "$m" ] && { MODEL=$m; break; }
    done
fi
[ -n "$MODEL" ] && [ -e "$MODEL" ] || { echo "skip: no fixture model in $FIX"; exit 77; }
"$PY" -c 'import PIL, numpy' 2>/dev/null || { echo "skip: $PY lacks PIL/numpy"; exit 77; }
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
export MITASEG_MODEL=$MODEL

T=$(mktemp -d "/tmp/ms_$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
. "$(dirname "$HELPER")/check_e2e.sh"

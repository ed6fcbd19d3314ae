#!/usr/bin/env bash
# Creates .venv-upstream/ (ignored by git) with the upstream libraries of
# tools/tests/requirements-upstream.txt for tools/tests/test_upstream.py.
# Reuses Debian's PyTorch (--system-site-packages); installs nothing else
# system-wide. Exit 77 (skipped) when they cannot be installed here (no
# network to PyPI, no venv module, Debian's torch missing), 0 when ready.
set -uo pipefail
cd "$(dirname "$0")/../.."
venv=.venv-upstream
req=tools/tests/requirements-upstream.txt
stamp="$venv/.installed"
if [ -f "$stamp" ] && cmp -s "$stamp" "$req"; then exit 0; fi

skip() { echo "setup_upstream_venv: $*: upstream tests skipped" >&2; exit 77; }
/usr/bin/python3 -c "import torch, torchvision, numpy, scipy, matplotlib" 2>/dev/null ||
  skip "Debian's python3-torch/-torchvision/-numpy/-scipy/-matplotlib are not all installed (tools/setup.sh --dev)"
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv" 2>/dev/null || skip "python3 -m venv failed"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req" ||
  { rm -rf "$venv"; skip "pip could not install $req"; }
"$venv/bin/python" - <<'PY' || { rm -rf "$venv"; skip "the installed libraries do not import"; }
import sys
sys.path.insert(0, "tools/tests")
import upstream_env  # noqa: F401  (mmcv-lite has no compiled ops: see there)
import timm, mmseg  # noqa: F401
from mmseg.utils import register_all_modules
register_all_modules()
PY
cp "$req" "$stamp"

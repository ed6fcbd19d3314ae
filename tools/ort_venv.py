#!/usr/bin/env python3
"""The virtualenv that holds ONNX Runtime and onnx (registry packages, for
the benchmark and the export test only): build-bench-venv/ at the repository
root (ignored by git), made on first use from Debian's /usr/bin/python3 with
--system-site-packages, so Debian's PyTorch 1.13 stays importable in it.
numpy stays below 2: torch 1.13 cannot use numpy 2 ("Numpy is not
available"); Debian's numpy 1.24 already satisfies the pin.

  /usr/bin/python3 tools/ort_venv.py      makes it (if needed), prints its python

ensure() returns (python path, None) or (None, why it cannot be made); with
other arguments it makes other benchmark venvs the same way
(bench/bench_attention.py's PyTorch 2.x).
Also here, without torch, for every user of ONNX Runtime (the export check,
the benchmark's worker and driver): session() with the settings the
benchmark states, and rel_error().
"""
import os
import shutil
import subprocess
import sys

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_DIR = os.path.join(REPO_DIR, "build-bench-venv")
BASE_PYTHON = "/usr/bin/python3"
PACKAGES = ["onnxruntime>=1.17", "onnx>=1.15", "numpy<2"]
# Run by the new venv's python: must import what the venv is for and print
# the versions (kept in DONE_MARK).
CHECK = ("import onnxruntime, onnx, numpy, torch; "
         "print('onnxruntime', onnxruntime.__version__, 'onnx', onnx.__version__,"
         " 'numpy', numpy.__version__, 'torch', torch.__version__)")
# Marks a finished install: a venv cut short (timeout, no network) is never used.
DONE_MARK = "mitaseg-packages.txt"


def venv_python(venv_dir=VENV_DIR):
    return os.path.join(venv_dir, "bin", "python")


def ensure(venv_dir=VENV_DIR, timeout_s=900, packages=PACKAGES, check=CHECK, system_site=True):
    """Makes the venv once. The install goes into a temporary folder that is
    renamed into place only when complete, so a killed or failed install
    leaves nothing half-made (python finds its venv from pyvenv.cfg next to
    bin/, so the renamed venv works; only pip's own scripts keep the old path,
    and we always run `python -m pip`)."""
    py = venv_python(venv_dir)
    if os.path.exists(os.path.join(venv_dir, DONE_MARK)) and os.access(py, os.X_OK):
        return py, None
    if not os.access(BASE_PYTHON, os.X_OK):
        return None, "%s not found (Debian's python3 with python3-torch)" % BASE_PYTHON
    tmp = "%s.tmp-%d" % (venv_dir, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    steps = [[BASE_PYTHON, "-m", "venv"] + (["--system-site-packages"] if system_site else [])
             + [tmp],
             [venv_python(tmp), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--timeout", "30", "--retries", "2"]
             + list(packages)]
    try:
        for cmd in steps:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=timeout_s)
            if r.returncode != 0:
                tail = r.stdout.strip().splitlines()[-1:] or ["exit %d" % r.returncode]
                return None, "'%s' failed: %s" % (" ".join(cmd[:4]), tail[0])
        r = subprocess.run([venv_python(tmp), "-c", check],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return None, "the new venv cannot import its packages: %s" % (
                (r.stderr.strip().splitlines() or ["?"])[-1])
        with open(os.path.join(tmp, DONE_MARK), "w") as f:
            f.write(r.stdout)
        shutil.rmtree(venv_dir, ignore_errors=True)   # an unfinished one from before
        os.rename(tmp, venv_dir)
        return py, None
    except subprocess.TimeoutExpired as e:
        return None, "'%s' took over %d s" % (" ".join(e.cmd[:4]), e.timeout)
    except OSError as e:
        return None, str(e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def session(path, threads):
    """ONNX Runtime session: CPU EP, intra-op threads, inter-op 1, every graph
    optimisation."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def rel_error(a, b):
    """max |a - b| / max |b| (the golden tests' measure); inf if shapes differ."""
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size != b.size:
        return float("inf")
    a, b = a.ravel(), b.ravel()
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


if __name__ == "__main__":
    python, why = ensure()
    if python is None:
        print("ort_venv: cannot make %s: %s" % (VENV_DIR, why), file=sys.stderr)
        sys.exit(77)
    print(python)

#!/usr/bin/python3
"""CPU benchmark: the same model file and the same image run by mitaseg (the
C engine, bench/bench_engine), by the PyTorch reference (tools/mitaseg_ref.py
on Debian's PyTorch) and by ONNX Runtime (the reference exported by
tools/export_onnx.py), side by side in one run, same thread count, batch 1.

  /usr/bin/python3 bench/bench_cpu.py [--build build] [--threads N] [--rounds 7]
      [--attention mita,full] [--no-ort] [--torch-python PY ...] [--json OUT.json]
      [--openblas-env native|keep]
      [--model FILE --size WxH [--image IMG]]

What is timed: one image from uint8 RGB pixels to logits + mask at the image
size, each contender with its own preprocessing and postprocessing
(mitaseg: engine_run; PyTorch: mitaseg_ref.segment under inference_mode;
ONNX Runtime: one session.run of the graph exported with --input image, which
holds the pre- and postprocessing). Each contender is its own persistent
worker process (it loads its libraries and the model once; thread pools never
compete); the driver asks them in turn, one run at a time: a warm-up round,
then --rounds timed rounds, the order rotated every round, with a short pause
between runs so no thread pool is still spinning when the next one starts.
Times are each worker's own clock around the call (no pipe overhead).
Reported: min and median ms, the ratio contender / mitaseg (> 1: mitaseg
faster), each worker's peak RSS (VmHWM: libraries, model and activations),
and the outputs checked against mitaseg's (logits relative error
max |a - b| / max |b|, % of mask pixels equal). Exit status 1 if an output
disagrees (relative error > 1e-3 or masks < 99.9 % equal).

Models (default): a DeiT-Tiny-sized UperNet with random weights
(bench/make_bench_model.py) on a 512x512 random image, and the shipped CamVid
model (assets/models/camvid-mita.safetensors) on a 480x360 CamVid frame
(../shared/data/camvid; random pixels where it is absent); each with its
configured MiTA and with full attention. --model/--size run one model instead.

ONNX Runtime comes from the registry, into build-bench-venv/ (made on first
use by tools/ort_venv.py); without it the ONNX Runtime column is skipped and
the report says why. PyTorch 2.x is not installed by this script (a multi-GB
download): pass --torch-python PATH of a python that has it to add it.

OpenBLAS: where the environment sets OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE
(some machines do, for older OpenBLAS builds), every worker runs without
them, with OpenBLAS's own choice for the CPU (--openblas-env keep: as set);
the report says which, and mitaseg's worker the core it got.

Note on MiTA: the reference (and so its ONNX export) computes MiTA's routed
logits densely (N x N scores, then a gather), as in training; mitaseg gathers
each query's k keys.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# libgomp's wait policy for every libgomp worker (mitaseg, PyTorch), set in
# main() before they start (libgomp reads it at load time): by default the
# short spin that mitaseg picks for itself on an otherwise idle machine
# (app/omp_env/omp_env.c; this benchmark wants an idle machine), or passive.
# Either way idle workers sleep between requests. ONNX Runtime keeps its own
# thread pool's default.
OMP_WAIT = {"spin": ("GOMP_SPINCOUNT", "10000"), "passive": ("OMP_WAIT_POLICY", "PASSIVE")}

# OpenBLAS's kernel choice. Some machines (this project's among them) set
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE in the environment, for older
# OpenBLAS builds that fail on their CPU. That pins every OpenBLAS user to
# the named core's kernels (Haswell's AVX2 on an AVX-512 CPU: half its
# sgemm rate), while PyTorch 2.x (MKL) and ONNX Runtime (MLAS) choose their
# own. "native" (the default) unsets both for every worker, as on a machine
# without them; "keep" leaves them. The workers report the core they got.
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def add_openblas_env_arg(ap):
    """--openblas-env, the same in every CPU benchmark script."""
    ap.add_argument("--openblas-env", choices=["native", "keep"], default="native",
                    help="native: unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for every worker "
                    "(default); keep: leave them")


def openblas_env(mode):
    """Applies --openblas-env to os.environ (before any worker starts or
    OpenBLAS loads here); returns a line for the report."""
    found = ["%s=%s" % (k, os.environ[k]) for k in OPENBLAS_VARS if k in os.environ]
    if not found:
        return "OpenBLAS: no OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE in the environment"
    if mode == "keep":
        return "OpenBLAS: %s kept (--openblas-env keep)" % " ".join(found)
    for k in OPENBLAS_VARS:
        os.environ.pop(k, None)
    return "OpenBLAS: %s unset for every worker (its own kernel choice)" % " ".join(found)


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOOLS = os.path.join(REPO, "tools")
sys.path.insert(0, TOOLS)

CAMVID_MODEL = os.path.join(REPO, "assets", "models", "camvid-mita.safetensors")
CAMVID_DIR = os.path.join(REPO, "..", "shared", "data", "camvid")
MAX_REL_ERROR, MIN_MASK_AGREE = 1e-3, 99.9


# --------------------------------------------------------------------------
# Workers (run as `bench_cpu.py --worker torch|ort ...`): print one JSON
# "ready" line, then answer "run" with {"ms": T} and "dump PATH" by writing
# PATH (.npz: logits, mask), until stdin ends.
# --------------------------------------------------------------------------

def serve(run, ready):
    print(json.dumps(dict(ready, ready=True)), flush=True)
    out = None
    for line in iter(sys.stdin.readline, ""):
        cmd = line.rstrip("\n")
        if cmd == "run":
            t0 = time.perf_counter()
            out = run()
            print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}), flush=True)
        elif cmd.startswith("dump ") and out is not None:
            import numpy as np
            np.savez(cmd[5:], logits=out[0], mask=out[1])
            print(json.dumps({"ok": True}), flush=True)
        else:
            sys.exit("bench_cpu worker: unknown command (or dump before run): %r" % cmd)


def worker_torch(args):
    import numpy as np
    import torch
    import mitaseg_ref
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    model = mitaseg_ref.load_model(args.model)
    img = np.load(args.image)
    attn = {"type": args.attention}

    def run():
        with torch.inference_mode():
            mask, logits = mitaseg_ref.segment(model, img, attn=attn)
        return logits.numpy(), mask.numpy()

    serve(run, {"name": "PyTorch %s" % torch.__version__, "python": sys.executable,
                "threads": torch.get_num_threads()})


def worker_ort(args):
    import numpy as np
    import onnxruntime as ort
    import ort_venv
    sess = ort_venv.session(args.onnx, args.threads)
    feed = {sess.get_inputs()[0].name: np.load(args.image)}

    def run():
        logits, mask = sess.run(None, feed)
        return logits, mask

    serve(run, {"name": "ONNX Runtime %s" % ort.__version__, "python": sys.executable,
                "providers": sess.get_providers()})


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

class Worker:
    """One contender's process, asked one line at a time."""

    def __init__(self, key, cmd, log_path, env=None):
        self.key, self.cmd, self.log_path = key, cmd, log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, bufsize=1,
                                     env=dict(os.environ, **env) if env else None)
        self.info = self._read()
        self.times = []

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.flush()
            with open(self.log_path) as f:
                tail = f.read().strip().splitlines()[-3:]
            raise RuntimeError("%s worker stopped (exit %s): %s"
                               % (self.key, self.proc.returncode, " | ".join(tail) or "no message"))
        return json.loads(line)

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def peak_rss_mb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
        return float("nan")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def model_config(path):
    """The model file's config (safetensors header metadata), without the weights."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n < 1 << 26:
            raise SystemExit("bench_cpu: %s: not a safetensors model file" % path)
        header = json.loads(f.read(n))
    return json.loads(header["__metadata__"]["config"])


def attention_label(cfg, attention):
    if attention == "full":
        return "full"
    att = dict({"landmarks": [7, 7], "topk": 49}, **cfg["backbone"].get("attention", {}))
    return "MiTA %dx%d, k %d" % (att["landmarks"][0], att["landmarks"][1], att["topk"])


def cpu_description():
    """CPU model name (as the VM reports it), the vector ISAs that matter, cores."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = ", ".join(x for x, f in (("AVX2", "avx2"), ("FMA", "fma"), ("AVX-512", "avx512f")) if f in flags)
    return "%s (%s), %d cores online" % (name, isa or "no AVX2", os.cpu_count() or 0)


def git_version():
    r = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def save_image(rgb, stem):
    """The image as PNG (mitaseg reads it) and .npy (the Python workers): same pixels."""
    import numpy as np
    from PIL import Image
    Image.fromarray(rgb).save(stem + ".png")
    np.save(stem + ".npy", rgb)
    return stem + ".png", stem + ".npy"


def camvid_frame():
    """The first frame of CamVid's val list (else train), or None."""
    for lst in ("val.txt", "train.txt"):
        p = os.path.join(CAMVID_DIR, lst)
        if os.path.exists(p):
            with open(p) as f:
                first = f.readline().split()
            if first and os.path.exists(os.path.join(CAMVID_DIR, first[0])):
                return os.path.join(CAMVID_DIR, first[0])
    return None


def load_rgb(path):
    import numpy as np
    from PIL import Image
    return np.array(Image.open(path).convert("RGB"))


def random_rgb(w, h):
    import numpy as np
    return np.random.default_rng(12345).integers(0, 256, (h, w, 3), dtype=np.uint8)


def make_cases(args, tmp):
    """[(title, model path, (w, h), png, npy)]"""
    cases = []
    if args.model:
        rgb = load_rgb(args.image) if args.image else random_rgb(*args.size)
        h, w = rgb.shape[:2]
        src = os.path.basename(args.image) if args.image else "random pixels"
        cases.append(("%s, %dx%d, %s" % (os.path.basename(args.model), w, h, src), args.model,
                      (w, h)) + save_image(rgb, os.path.join(tmp, "custom")))
        return cases
    bench_model = os.path.join(tmp, "deit-tiny.safetensors")
    subprocess.run([sys.executable, os.path.join(HERE, "make_bench_model.py"), "deit-tiny",
                    "512", bench_model], check=True)
    cases.append(("DeiT-Tiny-sized UperNet (random weights, bench/make_bench_model.py), "
                  "512x512 (N = 1024), random pixels", bench_model, (512, 512))
                 + save_image(random_rgb(512, 512), os.path.join(tmp, "random512")))
    frame = camvid_frame()
    rgb = load_rgb(frame) if frame else random_rgb(480, 360)
    cases.append(("shipped CamVid model (assets/models/camvid-mita.safetensors), %dx%d, %s"
                  % (rgb.shape[1], rgb.shape[0],
                     "CamVid frame %s" % os.path.basename(frame) if frame else
                     "random pixels (no ../shared/data/camvid)"),
                  CAMVID_MODEL, (rgb.shape[1], rgb.shape[0]))
                 + save_image(rgb, os.path.join(tmp, "camvid")))
    return cases


def ort_python(args):
    """(venv python, None) or (None, why ONNX Runtime is skipped)."""
    if args.no_ort:
        return None, "--no-ort"
    import ort_venv
    return ort_venv.ensure()


def export_onnx(py, model, size, attention, out):
    cmd = [py, os.path.join(TOOLS, "export_onnx.py"), model, out, "--size", "%dx%d" % size,
           "--attention", attention, "--input", "image"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("export failed: %s" % (r.stderr.strip().splitlines() or ["?"])[-1])


def load_output(path):
    """(logits, mask) of a worker's dump: mitaseg's safetensors or a worker's .npz."""
    import numpy as np
    if path.endswith(".npz"):
        d = np.load(path)
        return d["logits"], d["mask"]
    import safetensors_io
    t, _ = safetensors_io.load(path)
    return np.asarray(t["logits"]), np.asarray(t["mask"])


def compare(a, b):
    """(logits relative error of a against b, % mask pixels equal)."""
    import numpy as np
    from ort_venv import rel_error
    ma, mb = np.asarray(a[1]).ravel(), np.asarray(b[1]).ravel()
    if ma.shape != mb.shape:
        return float("inf"), 0.0
    return rel_error(a[0], b[0]), 100.0 * float(np.mean(ma == mb))


def run_case(args, tmp, case, attention, ort_py):
    """Runs one (model, attention) with every contender. Returns result rows."""
    title, model, size, png, npy = case
    me = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
          "--image", npy]
    engine = [os.path.join(args.build, "bench_engine"), "--model", model, "--image", png,
              "--threads", str(args.threads), "--attention", attention, "--serve"]
    specs = [("mitaseg", engine)]
    if args.gemm_both:   # the same engine on the other GEMM library, in the same rounds
        specs.append(("mitaseg-openblas", engine, {"MS_GEMM": "openblas"}))
    for i, py in enumerate(args.torch_python):
        specs.append(("torch%d" % i, [py] + me[1:] + ["--worker", "torch", "--model", model,
                                                        "--attention", attention]))
    skipped = []
    if ort_py:
        onnx = os.path.join(tmp, "%s-%s.onnx" % (os.path.basename(model), attention))
        try:
            export_onnx(ort_py, model, size, attention, onnx)
            specs.append(("ort", [ort_py] + me[1:] + ["--worker", "ort", "--onnx", onnx]))
        except RuntimeError as e:
            skipped.append("ONNX Runtime: %s" % e)
    workers = []
    try:
        for key, cmd, *env in specs:
            workers.append(Worker(key, cmd, os.path.join(tmp, "%s-%s.log" % (key, attention)),
                                  env[0] if env else None))
        if args.gemm_both and workers[0].info.get("gemm") == "openblas":
            raise RuntimeError("--gemm-both: the engine runs OpenBLAS already (%s doctor says why)"
                               % os.path.join(args.build, "mitaseg"))
        for r in range(args.rounds + 1):   # round 0: warm-up, not counted
            k = r % len(workers)
            for w in workers[k:] + workers[:k]:
                ms = w.ask("run")["ms"]
                if r > 0:
                    w.times.append(ms)
                time.sleep(args.gap)
        outputs = {}
        for w in workers:
            path = os.path.join(tmp, "%s-%s.%s" % (w.key, attention, "safetensors"
                                                   if w.key.startswith("mitaseg") else "npz"))
            w.ask("dump " + path)
            outputs[w.key] = load_output(path)
        rows = []
        base = workers[0]
        for w in workers:
            err, agree = compare(outputs[w.key], outputs["mitaseg"])
            name = {"mitaseg": "mitaseg",
                    "mitaseg-openblas": "mitaseg, MS_GEMM=openblas"}.get(w.key) or w.info["name"]
            rows.append({"contender": name,
                         "min_ms": min(w.times), "median_ms": statistics.median(w.times),
                         "times_ms": w.times, "peak_rss_mb": w.peak_rss_mb(),
                         "rel_error": err if w is not base else 0.0,
                         "mask_equal_pct": agree, "info": w.info})
        for row in rows:
            row["ratio_min"] = row["min_ms"] / rows[0]["min_ms"]
            row["ratio_median"] = row["median_ms"] / rows[0]["median_ms"]
        return rows, skipped
    finally:
        for w in workers:
            w.close()


def print_table(title, results):
    print("\n%s\n" % title)
    print("| attention | contender | min / median ms | contender / mitaseg (min / median) "
          "| peak RSS | logits rel. error | masks equal |")
    print("|---|---|---|---|---|---|---|")
    for label, rows in results:
        for i, r in enumerate(rows):
            ratio = "1" if i == 0 else "%.2fx / %.2fx" % (r["ratio_min"], r["ratio_median"])
            check = ("(reference)", "") if i == 0 else (
                "%.1e" % r["rel_error"], "%.3f %%" % r["mask_equal_pct"])
            print("| %s | %s | %.0f / %.0f | %s | %.0f MB | %s | %s |"
                  % (label if i == 0 else "", r["contender"], r["min_ms"], r["median_ms"], ratio,
                     r["peak_rss_mb"], check[0], check[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds after the warm-up round")
    ap.add_argument("--gap", type=float, default=0.1, help="pause between runs, s")
    ap.add_argument("--omp-wait", choices=sorted(OMP_WAIT), default="spin",
                    help="libgomp wait policy of the mitaseg and PyTorch workers (default: spin, "
                    "GOMP_SPINCOUNT=10000, what mitaseg picks on an idle machine)")
    add_openblas_env_arg(ap)
    ap.add_argument("--attention", default="mita,full")
    ap.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    ap.add_argument("--gemm-both", action="store_true",
                    help="also the engine with MS_GEMM=openblas, where it runs oneDNN")
    ap.add_argument("--torch-python", action="append", default=None,
                    help="python with the PyTorch to run (repeatable; default /usr/bin/python3)")
    ap.add_argument("--model", default=None, help="run this model file instead of the standard two")
    ap.add_argument("--size", default=None, help="image size WxH for --model (random pixels)")
    ap.add_argument("--image", default=None, help="image for --model (its size wins)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--worker", choices=["torch", "ort"], help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.worker and not (os.environ.get("OMP_WAIT_POLICY")
                                or os.environ.get("GOMP_SPINCOUNT")):
        key, value = OMP_WAIT[args.omp_wait]
        os.environ[key] = value
    blas_note = None if args.worker else openblas_env(args.openblas_env)
    if args.worker == "torch":
        return worker_torch(args)
    if args.worker == "ort":
        return worker_ort(args)
    if args.model:
        if not (args.size or args.image):
            ap.error("--model needs --size WxH or --image")
        for path in (args.model, args.image):
            if path and not os.path.isfile(path):
                ap.error("%s: no such file" % path)
        if args.size:
            try:
                size = tuple(int(v) for v in args.size.lower().split("x"))
                if len(size) != 2 or min(size) < 1:
                    raise ValueError
            except ValueError:
                ap.error("--size: expected WxH, got '%s'" % args.size)
            args.size = size
    if args.threads < 1 or args.rounds < 1:
        ap.error("--threads and --rounds must be positive")
    attentions = [a for a in args.attention.split(",") if a]
    if not attentions or set(attentions) - {"mita", "full"}:
        ap.error("--attention: a list of mita and full")
    args.torch_python = args.torch_python or ["/usr/bin/python3"]
    if not os.access(os.path.join(args.build, "bench_engine"), os.X_OK):
        sys.exit("bench_cpu: %s/bench_engine not found: build first (ninja -C %s)"
                 % (args.build, args.build))

    ort_py, why = ort_python(args)
    load0 = os.getloadavg()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "cpu": cpu_description(), "threads": args.threads, "rounds": args.rounds,
              "mitaseg": git_version(), "skipped": [], "cases": []}
    if not ort_py:
        report["skipped"].append("ONNX Runtime: %s" % why)
    bad = False
    with tempfile.TemporaryDirectory(prefix="bench_cpu-") as tmp:
        for case in make_cases(args, tmp):
            cfg = model_config(case[1])
            results = []
            for attention in attentions:
                try:
                    rows, skipped = run_case(args, tmp, case, attention, ort_py)
                except RuntimeError as e:   # a worker died: its log's last lines
                    sys.exit("bench_cpu: %s, %s attention: %s" % (case[0], attention, e))
                report["skipped"] += skipped
                results.append((attention_label(cfg, attention), rows))
                bad |= any(r["rel_error"] > MAX_REL_ERROR or r["mask_equal_pct"] < MIN_MASK_AGREE
                           for r in rows)
            report["cases"].append({"title": case[0], "results": results})
    report["loadavg"] = [load0[0], os.getloadavg()[0]]
    report["openblas_env"] = blas_note

    libs = {}
    for c in report["cases"]:
        for _, rows in c["results"]:
            for r in rows:
                info = r["info"]
                if r["contender"] == "mitaseg":
                    libs["mitaseg"] = "mitaseg %s (%s build, %s CPU kernels; %s; GEMMs by %s)" % (
                        report["mitaseg"], "CUDA-enabled" if info["cuda_linked"] else "CPU-only",
                        info.get("cpu_path", "?"), info["openblas"], info.get("gemm", "?"))
                elif r["contender"].startswith("mitaseg"):
                    pass
                elif r["contender"].startswith("ONNX"):
                    libs[r["contender"]] = "%s (CPU EP, intra-op %d, inter-op 1, all graph " \
                        "optimisations; opset 17 export)" % (r["contender"], args.threads)
                else:
                    libs[r["contender"]] = "%s (%s)" % (r["contender"], info["python"])
    wait = ", ".join("%s=%s" % (k, os.environ[k]) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                     if os.environ.get(k))
    print("Machine: %s; %d threads; %s; load average %.1f at start, %.1f at end; libgomp %s"
          % (report["cpu"], args.threads, report["date"], *report["loadavg"], wait))
    print("Versions: %s" % "; ".join(libs.values()))
    print(blas_note)
    print("Batch 1, uint8 pixels to logits + mask; 1 warm-up + %d timed rounds, contenders "
          "interleaved. Ratio = contender / mitaseg (> 1: mitaseg faster). Peak RSS = VmHWM of "
          "each worker process." % args.rounds)
    for s in report["skipped"]:
        print("Skipped: %s" % s)
    for c in report["cases"]:
        print_table(c["title"], c["results"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if bad:
        print("\nbench_cpu: an output disagrees with mitaseg's (relative error > %.0e or masks "
              "< %.1f %% equal)" % (MAX_REL_ERROR, MIN_MASK_AGREE), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Subprocess side of the kernel X-ray (:mod:`flyexplore.insight.xray`). Not a public module.

Run as ``python _xray_worker.py JOBS.json RESULTS.json`` by :func:`flyexplore.insight.xray.xray_batch`,
in a fresh process whose environment already holds flydsl's compile-only switches
(``COMPILE_ONLY=1``, ``FLYDSL_GPU_ARCH``, ``FLYDSL_DUMP_IR=1``, ``FLYDSL_RUNTIME_ENABLE_CACHE=0``,
``ROCM_PATH``): torch's arch lookup and flydsl's settings are read once per process, so a fresh
process is the only way to get them right and to leave the user's caches alone.

For each job it calls the family's X-ray builder, named by the job as ``"module:function"``
(the family's ``FlyDSLPath.xray``, e.g. ``flyexplore.ops.rmsnorm.xray:build``; the modules are
found on the parent's ``sys.path``, passed in the jobs file). A builder asks torch 2.15's own
dispatch predicates whether the case takes FlyDSL on the target arch (under ``FakeTensorMode``
with ``device="cuda:0"`` tensors, :func:`flyexplore.ops.xray_kit.fake_cuda`; no GPU is touched)
and returns a :class:`flyexplore.ops.xray_kit.XRayVerdict` whose builds call torch's own kernel builders with ``device="meta"`` tensors of
the right shapes, so flydsl compiles the very kernel torch would build and dumps its IR and ISA
into a folder per kernel (``FLYDSL_DUMP_DIR`` is set per build). Nothing here copies torch's code:
it imports and calls it. This file imports nothing from flyexplore at the top, so it runs by path;
the builders' helpers live with the operator catalogue (:mod:`flyexplore.ops.xray_kit`).

Results are written after every job (atomically), so a timeout still leaves the finished ones.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time
import traceback


# ---------------------------------------------------------------------------------- driver
def _verdict(job, arch):
    """The job's builder (``job["builder"]``, ``"module:function"``) called with the case."""
    import importlib

    mod, _, fn = job["builder"].partition(":")
    build = getattr(importlib.import_module(mod), fn)
    return build(job["params"], job["dtype"], job.get("torch_dtype"), arch, bool(job.get("autotune", False)))


def _find_isa(folder):
    return sorted(glob.glob(os.path.join(folder, "*", "*_final_isa.s")))


def _run_job(i, job, arch, dump_root, done):
    v = _verdict(job, arch)
    res = {"eligible": v.eligible, "reason": v.reason, "predicate": v.predicate, "notes": v.notes,
           "kernels": []}
    forced = job.get("verdict")
    if forced is not None:
        res["torch_eligible"], res["torch_reason"] = v.eligible, v.reason
        res["eligible"], res["reason"] = bool(forced["eligible"]), forced["reason"]
        if bool(forced["eligible"]) != v.eligible:
            res["notes"].append(f"torch's own predicate ({v.predicate}) says "
                                f"{'eligible' if v.eligible else 'not eligible'}: {v.reason}")
    if not res["eligible"]:
        return res
    if not v.builds:
        res["error"] = f"no kernel to build: torch's own predicate ({v.predicate}) refuses this case"
        return res
    if job.get("needs_device_libs") and not job.get("device_libs", True):
        res["error"] = (f"{job['needs_device_libs']}, and none were found: apt-get install rocm-device-libs "
                        "(Debian/Ubuntu), or set FLYEXPLORE_ROCM_DEVICE_LIBS / ROCM_PATH to a ROCm install")
        return res
    for j, (family, cfg, key, build) in enumerate(v.builds):
        rec = {"family": family, "config": cfg}
        if key in done:
            rec.update(done[key], reused=True)
            res["kernels"].append(rec)
            continue
        folder = os.path.join(dump_root, f"job{i:04d}_{j:03d}")
        os.environ["FLYDSL_DUMP_DIR"] = folder
        t0 = time.perf_counter()
        try:
            build()
            rec["error"] = None
        except Exception as exc:  # a failed build is a result, not the end of the batch
            rec["error"] = f"{type(exc).__name__}: {exc}".strip()[:2000]
            rec["traceback"] = traceback.format_exc()[-4000:]
        rec["compile_s"] = time.perf_counter() - t0
        rec["isa"] = _find_isa(folder)
        rec["dump_dir"] = folder
        if not rec["isa"] and rec["error"] is None:
            rec["error"] = "flydsl wrote no final ISA (is the kernel cache disabled and FLYDSL_DUMP_IR set?)"
        done[key] = {k: rec[k] for k in ("compile_s", "isa", "dump_dir", "error")}
        res["kernels"].append(rec)
    return res


def _write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def main(argv):
    jobs_path, results_path = argv
    with open(jobs_path) as f:
        spec = json.load(f)
    arch = spec["arch"]
    here = os.path.dirname(os.path.abspath(__file__))  # run by path: this package's folder is not a top level
    extra = [p for p in spec.get("sys_path", []) if p not in sys.path]
    sys.path[:] = [p for p in extra + sys.path if os.path.abspath(p or ".") != here]
    t0 = time.perf_counter()
    import flydsl
    import torch  # noqa: F401  (import cost is reported separately from compile time)
    out = {"versions": {"torch": torch.__version__, "flydsl": getattr(flydsl, "__version__", "?")},
           "import_s": time.perf_counter() - t0, "results": []}
    done = {}
    for i, job in enumerate(spec["jobs"]):
        try:
            res = _run_job(i, job, arch, spec["dump_root"], done)
        except Exception as exc:
            res = {"eligible": False, "reason": None, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-4000:], "kernels": [], "notes": []}
        out["results"].append(res)
        _write(results_path, out)
    _write(results_path, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

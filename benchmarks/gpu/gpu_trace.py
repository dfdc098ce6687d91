"""What really runs on a GPU: trace ATen and Triton GEMMs, each SDPA backend, RMSNorm and TopK,
and classify the real kernel names (flyexplore.insight.trace).

    python benchmarks/gpu/gpu_trace.py OUT_DIR [--small] [--reps 5] [--skip-compile]

Writes to OUT_DIR:
  env.json        flyexplore's environment report (as ``flyexplore env --json``) with the run's
                  provenance under ``provenance`` (commit, flyexplore's version, the machine)
  traces.json     one record per (case, backend): status, observed families, kernels, autotune
  kernels.csv     one row per kernel: case, backend, name, family, library, calls, us
  autotune.csv    one row per autotune candidate: case, backend, op, name, family, time_ms, winner
  unclassified.txt  kernel names no classifier rule knows (to extend the rules)
  summary.txt     the human-readable log printed while running

Cases (bf16 unless said; ``--small`` shrinks every size for a CPU smoke run):
  GEMM NT (a @ b.T) 4096^3 and 16x28672x4096: eager ATen; torch.compile max-autotune with
  Triton templates only; and with ATEN,TRITON (the autotune decision shows who won).
  SDPA causal forward b4 h32 s2048 d128: FLASH, EFFICIENT, CUDNN, MATH, each alone.
  RMSNorm 8192x4096 and TopK fp32 (4096x2048 k=8, 4096x32768 k=64) eager, FlyDSL switched off
  and on (only meaningful on ROCm torch >= 2.15; elsewhere the switch says so).

Works on torch 2.11 (no torch.backends.python_native, no FlyDSL): those switches report
"not in this torch" and everything else runs. Compile cases need a GPU (Triton) and are
recorded as skipped on a CPU. About 2-4 minutes on one H200 (most of it Triton autotuning).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _log(lines: list[str], text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def _gemm_cases(small: bool):
    return [(64, 64, 64), (16, 256, 64)] if small else [(4096, 4096, 4096), (16, 28672, 4096)]


def _record(case: str, backend: str, status: str, tr=None, message: str | None = None,
            first_call_ms: float | None = None, extra: dict | None = None) -> dict:
    rec = {"case": case, "backend": backend, "status": status, "message": message,
           "first_call_ms": first_call_ms}
    if tr is not None:
        rec.update(tr.to_dict())
    if extra:
        rec.update(extra)
    return rec


def run(out: Path, small: bool = False, reps: int = 5, skip_compile: bool = False) -> list[dict]:
    import torch

    from flyexplore.world import switches
    from flyexplore.world.env import collect, env_json
    from flyexplore.insight.trace import trace

    out.mkdir(parents=True, exist_ok=True)
    env = collect()
    (out / "env.json").write_text(env_json("benchmarks/gpu/gpu_trace.py", env))
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda:0" if gpu else "cpu")
    log: list[str] = []
    recs: list[dict] = []
    _log(log, f"torch {torch.__version__} on {env.device.name} ({env.platform}); device {dev}")
    _log(log, switches.text())

    def attempt(case, backend, make_fn, extra=None):
        t0 = time.perf_counter()
        try:
            fn = make_fn()
            tr = trace(fn, device=dev, reps=reps, warmup=1)
            first = (time.perf_counter() - t0) * 1e3
            rec = _record(case, backend, "ok", tr, first_call_ms=first, extra=extra)
            _log(log, f"\n== {case} [{backend}] ({first / 1e3:.1f} s incl. compile)\n{tr.to_text()}")
        except Exception as exc:  # a backend that cannot run here is a result, not a crash
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:400]
            rec = _record(case, backend, "error", message=msg, extra=extra)
            _log(log, f"\n== {case} [{backend}] ERROR {msg}")
            if os.environ.get("FLYEXPLORE_DEBUG"):
                traceback.print_exc()
        recs.append(rec)
        return rec

    # -- GEMMs ---------------------------------------------------------------------------
    for m, n, k in _gemm_cases(small):
        case = f"gemm {m}x{n}x{k} NT bf16"
        g = torch.Generator(device=dev).manual_seed(0)
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g)

        def mm(x, y):
            return x @ y.t()

        attempt(case, "aten", lambda: (lambda: mm(a, b)))
        for name, backends in (("triton", "TRITON"), ("aten+triton autotune", "ATEN,TRITON")):
            if skip_compile or not gpu:
                recs.append(_record(case, name, "skipped",
                                    message="--skip-compile" if skip_compile else "Triton GEMM templates need a GPU"))
                _log(log, f"\n== {case} [{name}] skipped")
                continue

            def make(backends=backends):
                torch._dynamo.reset()
                # Caches off (FX graph cache, autotune cache): lower and autotune anew, so the
                # decision is seen. (force_disable_caches is no torch.compile option in 2.11.)
                opts = {"max_autotune": True, "max_autotune_gemm_backends": backends, "triton.cudagraphs": False,
                        "fx_graph_cache": False, "autotune_local_cache": False}
                f = torch.compile(mm, dynamic=False, options=opts)
                return lambda: f(a, b)

            attempt(case, name, make, {"compile_options": {"max_autotune_gemm_backends": backends}})
        del a, b

    # -- SDPA ----------------------------------------------------------------------------
    bsz, heads, seq, hd = (1, 2, 128, 64) if small else (4, 32, 2048, 128)
    case = f"sdpa causal fwd b{bsz} h{heads} s{seq} d{hd} bf16"
    g = torch.Generator(device=dev).manual_seed(0)
    q, kk, v = (torch.randn(bsz, heads, seq, hd, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    for name in ("flash", "efficient", "cudnn", "math"):
        def make(name=name):
            def call():
                with switches.sdpa([name]):
                    return torch.nn.functional.scaled_dot_product_attention(q, kk, v, is_causal=True)
            call()  # raises here when the backend cannot run this call
            return call
        attempt(case, name, make)
    del q, kk, v

    # -- eager RMSNorm and TopK, FlyDSL off / on ----------------------------------------------
    mr, nr = (256, 1024) if small else (8192, 4096)
    x = torch.randn(mr, nr, device=dev, dtype=torch.bfloat16)
    w = torch.randn(nr, device=dev, dtype=torch.bfloat16)
    topk_cases = [(256, 2048, 8), (256, 8192, 64)] if small else [(4096, 2048, 8), (4096, 32768, 64)]
    for on in (False, True):
        label = "flydsl on" if on else "flydsl off"
        state = {s.op: f"{s.flydsl} (exists={s.exists}, effective={s.effective})" for s in switches.states()}

        def make_rms(on=on):
            def call():
                with switches.flydsl("rmsnorm", enabled=on, warn=False):
                    return torch.nn.functional.rms_norm(x, (nr,), w, 1e-6)
            return call
        attempt(f"rmsnorm {mr}x{nr} bf16", label, make_rms, {"switch": state["rmsnorm"]})
        for tm, tn, tk in topk_cases:
            t = torch.randn(tm, tn, device=dev, dtype=torch.float32)

            def make_topk(on=on, t=t, tk=tk):
                def call():
                    with switches.flydsl("topk", enabled=on, warn=False):
                        return torch.topk(t, tk, dim=-1)
                return call
            attempt(f"topk {tm}x{tn} k={tk} fp32", label, make_topk, {"switch": state["topk"]})

    # -- files -----------------------------------------------------------------------------
    (out / "traces.json").write_text(json.dumps({"fingerprint": env.fingerprint(), "records": recs},
                                                indent=2, default=str))
    unclassified = set()
    with open(out / "kernels.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["case", "backend", "where", "name", "family", "library", "calls", "us"])
        for r in recs:
            for kd in r.get("kernels", []) + r.get("cpu_ops", []):
                wr.writerow([r["case"], r["backend"], kd["where"], kd["name"], kd["family"], kd["library"],
                             kd["calls"], f"{kd['us']:.3f}"])
                if kd["family"] == "unclassified":
                    unclassified.add(kd["name"])
    with open(out / "autotune.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["case", "backend", "op", "source", "name", "family", "time_ms", "winner"])
        for r in recs:
            for d in r.get("autotune", []):
                for c in d["candidates"]:
                    wr.writerow([r["case"], r["backend"], d["op"], d["source"], c["name"], c["family"],
                                 c["time_ms"], c["name"] == d["winner"]])
    (out / "unclassified.txt").write_text("".join(f"{n}\n" for n in sorted(unclassified)))
    (out / "summary.txt").write_text("\n".join(log) + "\n")
    print(f"\nwrote {out}: {len(recs)} records, {len(unclassified)} unclassified kernel names")
    return recs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="output folder")
    p.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    p.add_argument("--reps", type=int, default=5, help="profiled calls per case (default 5)")
    p.add_argument("--skip-compile", action="store_true", help="skip the torch.compile GEMM cases")
    a = p.parse_args(argv)
    run(Path(a.out), small=a.small, reps=a.reps, skip_compile=a.skip_compile)
    return 0


if __name__ == "__main__":
    sys.exit(main())

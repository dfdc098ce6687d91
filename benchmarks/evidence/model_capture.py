"""What capturing and explaining a whole model costs: time and peak memory of ``flyexplore model``.

Measures :func:`flyexplore.views.model.model_coverage` on the built-in full-depth Llama-3.1-8B
(no weights: fake tensors under ``FakeTensorMode``), prefill 1x2048 plus decode batch 32 at
context 2048, in both views (eager and compiled), the coverage table and its terminal text
included: what ``flyexplore model`` does. Goal (the issue): under 20 s and under 2 GB peak
memory on the 2-core CPU machine.

How: each repetition is a fresh Python process (``python benchmarks/evidence/model_capture.py --child``),
so the import time and the peak RSS are those of a real run. The child times its stages --
imports (flyexplore, pandas, torch, transformers: what the run imports anyway; transformers'
per-model modules, and what they pull in -- torchao, torch.distributed.tensor, Inductor's
decompositions -- are imported later, inside the build), model build, capture (per phase and view, the decode cache's unrecorded prefill
apart), judging (per capture), coverage table and text -- by wrapping the library's functions
from outside (no library code changed), and reports its ``ru_maxrss`` (RUSAGE_SELF, and
RUSAGE_CHILDREN should it start any). The parent times the whole process with
``time.perf_counter`` around it (interpreter start-up included: that wall time is what the goal
is judged on) and reads its peak RSS with ``os.wait4``. Then the CLI end to end, once:
``flyexplore model --hf llama-3.1-8b --phase prefill:1x2048,decode:32x2048`` (one process, one
build). ``--models all`` adds the other built-in
models (qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b), one fresh process each at the same phases:
information, no goal.

The report names the machine (CPUs, load average before and after, Python, torch and
transformers versions): on a loaded 2-core machine the times wander. PASS means every
repetition met both goals (the max); the median is beside it. Exits 1 on FAIL.
Output: the report as text in ``data/bench/model_capture.txt`` (``--out``), also printed; its
first line is the provenance (:func:`flyexplore.world.env.provenance`: commit, flyexplore's
version, the machine).
Usage: ``python benchmarks/evidence/model_capture.py [--reps 3] [--models llama|all] [--out FILE]``.
"""
from __future__ import annotations

import time

_T0 = time.perf_counter()  # the child's first clock reading, before anything else is imported

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks/evidence/model_capture.py"
GOAL_S = 20.0
GOAL_BYTES = 2e9  # "2 GB": 2,000,000,000 bytes (1907 MiB), the stricter reading
MAIN_MODEL = "llama-3.1-8b"
OTHER_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b")
PHASES = [("prefill", 1, 2048), ("decode", 32, 2048)]
VIEWS = ("eager", "compiled")
MARK = "MODEL_CAPTURE_JSON "


def _rss_kib() -> dict:
    """VmRSS and VmHWM (the peak so far) of this process, KiB, from /proc/self/status (Linux)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, v in (x.split(":", 1) for x in lines) if k in ("VmRSS", "VmHWM")}


# -- the child: one measured run ---------------------------------------------------------------------

def child(model: str) -> int:
    """Run :func:`model_coverage` for ``model`` with every stage timed; print one JSON line."""
    t_start = _T0
    # in the CLI's order: flyexplore and the view module first, then what the run imports anyway
    import flyexplore  # noqa: I001
    from flyexplore.views.model import model_coverage
    import torch
    import transformers
    t_imp = time.perf_counter()
    mem = {"imports": _rss_kib()}

    from flyexplore.insight import coverage as CV
    from flyexplore.insight import hf as HF
    from flyexplore.results import model as RM

    spans: dict[str, list] = {"build": [], "capture_phases": [], "inputs": [], "run_step": [],
                              "judge_capture": [], "coverage_table": []}

    def timed(mod, name, key, label=None):
        fn = getattr(mod, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spans[key].append((label(a, k) if label else "", t, time.perf_counter()))
                if key in ("build", "capture_phases"):
                    mem[key] = _rss_kib()
        setattr(mod, name, wrapper)

    timed(HF, "build", "build")
    timed(HF, "capture_phases", "capture_phases")
    # _step makes the step's inputs, and for decode the KV cache by an unrecorded prefill (per view)
    timed(HF, "_step", "inputs", lambda a, k: f"{a[2]} {a[3]}x{a[4]}")
    timed(HF, "run_step", "run_step", lambda a, k: f"{k.get('phase')} {k.get('view')}")
    timed(CV, "judge_capture", "judge_capture", lambda a, k: f"{a[0].phase} {a[0].view}")
    timed(RM, "coverage_table", "coverage_table")

    cov = model_coverage(hf=model, phases=PHASES, views=VIEWS)
    t_cov = time.perf_counter()
    text = cov.text()
    t_end = time.perf_counter()
    mem["text"] = _rss_kib()

    def dur(key):
        return sum(b - a for _, a, b in spans[key])

    (_, cp0, cp1), = spans["capture_phases"]
    b = dur("build")
    self_ru = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    steps = [{"what": lab, "s": round(e - s, 3)} for lab, s, e in spans["run_step"]]
    inputs = [{"what": lab, "s": round(e - s, 3)} for lab, s, e in spans["inputs"]]
    judge = [{"what": lab, "s": round(e - s, 3)} for lab, s, e in spans["judge_capture"]]
    calls = {f"{c.phase} {c.view}": [len(c.calls), len(c.kernel_calls())] for c in cov.captures}
    out = {
        "model": model,
        "imports_s": t_imp - t_start,
        "build_s": b,
        "capture_s": (cp1 - cp0) - b,           # capture_phases less the build: inputs + recording
        "build_capture_s": cp1 - cp0,
        "judge_s": t_cov - cp1 - dur("coverage_table"),  # Envs, judge_capture (with what-ifs)
        "table_text_s": dur("coverage_table") + (t_end - t_cov),
        "coverage_table_s": dur("coverage_table"),
        "text_s": t_end - t_cov,
        "rest_s": cp0 - t_imp,                  # model_coverage's own imports and checks before capture
        "total_s": t_end - t_start,
        "steps": steps, "inputs": inputs, "judge": judge, "calls": calls,
        "table_rows": len(cov.table), "text_chars": len(text),
        "maxrss_kib": self_ru.ru_maxrss, "children_maxrss_kib": kids.ru_maxrss,
        "flyexplore_file": flyexplore.__file__, "mem": mem,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "flyexplore": flyexplore.__version__},
    }
    print(MARK + json.dumps(out), flush=True)
    return 0


# -- the parent: processes, timed -----------------------------------------------------------------

def run_process(cmd: list[str]) -> dict:
    """Run ``cmd`` as a child process; its wall time (perf_counter around it), exit status, peak
    RSS (``os.wait4``), stdout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fo, stderr=fe, text=True)
        _, status, ru = os.wait4(p.pid, 0)  # reaps it: its own peak RSS, not the max of all children
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    return {"wall_s": wall, "rc": p.returncode, "maxrss_kib": ru.ru_maxrss, "user_s": ru.ru_utime,
            "sys_s": ru.ru_stime, "stdout": out, "stderr": err}


def measure(model: str) -> dict:
    r = run_process([sys.executable, str(Path(__file__).resolve()), "--child", model])
    line = next((x for x in r["stdout"].splitlines() if x.startswith(MARK)), None)
    if r["rc"] != 0 or line is None:
        lines = (r["stderr"] or r["stdout"]).strip().splitlines()
        return {"model": model, "error": f"exit {r['rc']}: {lines[-1][:400] if lines else ''}", "wall_s": r["wall_s"],
                "maxrss_kib": r["maxrss_kib"]}
    d = json.loads(line[len(MARK):])
    d["wall_s"], d["wait4_maxrss_kib"] = r["wall_s"], r["maxrss_kib"]
    d["cpu_s"] = r["user_s"] + r["sys_s"]
    return d


def cli_runs(model: str) -> list[dict]:
    exe = Path(sys.executable).parent / "flyexplore"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "flyexplore"]
    out = []
    spec = ",".join(f"{ph}:{b}x{s}" for ph, b, s in PHASES)
    for cmd in (base + ["model", "--hf", model, "--phase", spec],):
        r = run_process(cmd)
        out.append({"cmd": " ".join(["flyexplore"] + cmd[len(base):]), "wall_s": r["wall_s"], "rc": r["rc"],
                    "maxrss_kib": r["maxrss_kib"], "cpu_s": r["user_s"] + r["sys_s"],
                    "lines": len(r["stdout"].splitlines()),
                    "err": "" if r["rc"] == 0 else (r["stderr"].strip().splitlines() or [""])[-1][:400]})
    return out


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB ({kib * 1024 / 1e9:.2f} GB)"


def _source() -> str:
    """Which flyexplore was measured: ROOT's git commit, ``-dirty`` when tracked files had changed
    (:func:`flyexplore.world.env.git_commit`; ``FLYEXPLORE_COMMIT`` / ``FLYEXPLORE_DIRTY`` in a copy
    without ``.git``)."""
    from flyexplore.world import env as ENV

    label = ENV.commit_label(ENV.git_commit(ROOT), ENV.git_dirty(ROOT))
    return f"the checkout at git {label}" if label else "not a git checkout (commit unknown)"


def _provenance() -> str:
    """The report's provenance line (:func:`flyexplore.world.env.provenance`; imports torch, so
    read after every measured process)."""
    from flyexplore.world import env as ENV

    return "# " + ENV.provenance_line(ENV.provenance(SCRIPT))


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def report(reps: list[dict], cli: list[dict], others: list[dict], load0: str, load1: str, loads: list[str]) -> str:
    L: list[str] = []
    ok = [r for r in reps if "error" not in r]
    v = ok[0]["versions"] if ok else {}
    L.append(f"model_capture: {MAIN_MODEL}, phases "
             + " + ".join(f"{p} {b}x{s}" for p, b, s in PHASES) + f", views {'+'.join(VIEWS)}")
    L.append(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
             f"Python {v.get('python', platform.python_version())}, torch {v.get('torch', '?')}, "
             f"transformers {v.get('transformers', '?')}, flyexplore {v.get('flyexplore', '?')}")
    L.append(f"flyexplore measured: {_source()}")
    L.append(f"load average (1, 5, 15 min): before {load0}; after {load1}")
    L.append(f"  before each repetition: {'; '.join(loads)}")
    L.append(f"goal: under {GOAL_S:.0f} s wall (the whole process, interpreter start-up included) and under "
             f"{GOAL_BYTES / 1e9:.0f} GB peak RSS")
    L.append("")
    for r in reps:
        if "error" in r:
            L.append(f"  rep: FAILED {r['error']}")
    if ok:
        L.append(f"{len(ok)} repetitions, each a fresh process (seconds; median / max):")
        rows = [("process wall (perf_counter around it)", "wall_s"),
                ("  in-process total (first line to text)", "total_s"),
                ("  imports (flyexplore, pandas, torch, transformers)", "imports_s"),
                ("  model build (from_config, fake parameters)", "build_s"),
                ("  capture (inputs, decode caches, recording)", "capture_s"),
                ("  model build + capture", "build_capture_s"),
                ("  judging (Envs, judge_capture, what-ifs)", "judge_s"),
                ("  coverage table + text", "table_text_s"),
                ("  other (model_coverage before capturing)", "rest_s"),
                ("CPU time (user + sys, wait4)", "cpu_s")]
        for name, k in rows:
            xs = [r[k] for r in ok]
            L.append(f"  {name:54s} {statistics.median(xs):7.2f} / {max(xs):7.2f}   "
                     f"[{', '.join(f'{x:.2f}' for x in xs)}]")
        rss = [r["wait4_maxrss_kib"] for r in ok]
        L.append(f"  {'peak RSS (wait4)':54s} {_mib(statistics.median(rss))} / {_mib(max(rss))}")
        L.append(f"  {'peak RSS (child RUSAGE_SELF)':54s} {_mib(max(r['maxrss_kib'] for r in ok))} (max; wait4 reads "
                 "~115 MiB more, as it does for a bare `import torch`: the goal is judged on wait4's)")
        kids = max(r["children_maxrss_kib"] for r in ok)
        L.append(f"  {'RUSAGE_CHILDREN of the child':54s} "
                 + (f"{_mib(kids)}: the short programs it runs (ldconfig -p, uname -p, ld.lld --version); "
                    "Linux credits a vfork+exec'd child with its parent's RSS high-water mark at exec, so "
                    "this is not memory of its own" if kids else "none (the run started no process)"))
        m = ok[0].get("mem", {})
        if m:
            L.append("  memory after each stage (first repetition, VmRSS / VmHWM peak so far): "
                     + "; ".join(f"{k.replace('capture_phases', 'capture')} {v.get('VmRSS', 0) / 1024:.0f} / "
                                 f"{v.get('VmHWM', 0) / 1024:.0f} MiB" for k, v in m.items()))
        L.append("")
        L.append("  per phase and view (median seconds): recording (run_step) | its inputs (decode: the "
                 "KV cache by an unrecorded prefill) | judging")
        keys = [s["what"] for s in ok[0]["steps"]]
        for i, key in enumerate(keys):
            rs = statistics.median(r["steps"][i]["s"] for r in ok)
            ins = statistics.median(r["inputs"][i]["s"] for r in ok)
            js = statistics.median(r["judge"][i]["s"] for r in ok)
            n = ok[0]["calls"].get(key, ["?", "?"])
            L.append(f"    {key:18s} {rs:6.2f} | {ins:6.2f} | {js:6.2f}   "
                     f"({n[0]} calls recorded, {n[1]} kernel calls)")
        L.append(f"  coverage table: {statistics.median(r['coverage_table_s'] for r in ok):.2f} s "
                 f"({ok[0]['table_rows']} rows); text: {statistics.median(r['text_s'] for r in ok):.2f} s "
                 f"({ok[0]['text_chars']} characters)")
        wall_max, rss_max = max(r["wall_s"] for r in ok), max(rss) * 1024
        failed = len(reps) - len(ok)
        t_ok, m_ok = wall_max < GOAL_S and not failed, rss_max < GOAL_BYTES
        L.append("")
        L.append(f"time goal:   {'PASS' if t_ok else 'FAIL'} (max {wall_max:.2f} s, median "
                 f"{statistics.median(r['wall_s'] for r in ok):.2f} s; goal < {GOAL_S:.0f} s)"
                 + (f"; {failed} of {len(reps)} repetitions did not finish" if failed else ""))
        L.append(f"memory goal: {'PASS' if m_ok else 'FAIL'} (max {rss_max / 1e9:.2f} GB; goal < "
                 f"{GOAL_BYTES / 1e9:.0f} GB)")
        L.append(f"overall:     {'PASS' if t_ok and m_ok else 'FAIL'}")
    else:
        L.append("overall:     FAIL (no repetition finished)")
    L.append("")
    L.append("CLI end to end, once (both phases in one invocation, --phase prefill:1x2048,decode:32x2048):")
    for c in cli:
        L.append(f"  {c['cmd']:70s} {c['wall_s']:6.2f} s, peak RSS {_mib(c['maxrss_kib'])}, "
                 f"CPU {c['cpu_s']:.2f} s, exit {c['rc']}, {c['lines']} lines"
                 + (f"\n    {c['err']}" if c["err"] else ""))
    if others:
        L.append("")
        L.append("other built-in models, once each, same phases and views (information, no goal):")
        for r in others:
            if "error" in r:
                L.append(f"  {r['model']:16s} FAILED after {r['wall_s']:.1f} s: {r['error']}")
                continue
            steps = ", ".join(f"{s['what']} {s['s']:.1f}" for s in r["steps"])
            L.append(f"  {r['model']:16s} wall {r['wall_s']:6.2f} s (imports {r['imports_s']:.2f}, build "
                     f"{r['build_s']:.2f}, capture {r['capture_s']:.2f}, judging {r['judge_s']:.2f}, table+text "
                     f"{r['table_text_s']:.2f}), peak RSS {_mib(r['wait4_maxrss_kib'])}")
            L.append(f"  {'':16s} recording per phase/view (s): {steps}; decode cache+inputs "
                     f"{sum(s['s'] for s in r['inputs'] if s['what'].startswith('decode')):.1f} s")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="fresh-process repetitions of the goal run (default 3)")
    ap.add_argument("--models", choices=("llama", "all"), default="llama",
                    help="all: also the other built-in models, once each (information)")
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "model_capture.txt"),
                    help="the report file (default data/bench/model_capture.txt)")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI end-to-end runs")
    ap.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child)
    load0 = _load()
    reps, loads = [], []
    for i in range(a.reps):
        loads.append(_load())
        r = measure(MAIN_MODEL)
        reps.append(r)
        print(f"rep {i + 1}/{a.reps}: " + (f"{r['wall_s']:.2f} s, {r['wait4_maxrss_kib'] / 1024:.0f} MiB"
                                           if "error" not in r else r["error"]), file=sys.stderr, flush=True)
    cli = [] if a.no_cli else cli_runs(MAIN_MODEL)
    others = []
    if a.models == "all":
        for m in OTHER_MODELS:
            others.append(measure(m))
            print(f"{m}: {others[-1]['wall_s']:.2f} s", file=sys.stderr, flush=True)
    if str(ROOT) not in sys.path:   # the parent reads the provenance from ROOT's flyexplore (the children run it)
        sys.path.insert(0, str(ROOT))
    text = report(reps, cli, others, load0, _load(), loads)
    text = _provenance() + "\n" + text
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text, end="")
    print(f"written to {out}", file=sys.stderr)
    ok = [r for r in reps if "error" not in r]
    passed = (len(ok) == len(reps) and ok and max(r["wall_s"] for r in ok) < GOAL_S
              and max(r["wait4_maxrss_kib"] for r in ok) * 1024 < GOAL_BYTES)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

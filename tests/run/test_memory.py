"""Issue 33, defect 1: a memory estimate from what really runs (:mod:`flyexplore.run.memory`).

Quick: the fit, the probes, the caches and the guard's decisions on fits given to them. Slow:
the estimate against the peak each CPU (family, backend) really reaches, each measured in a fresh
process, within 1.5x either side (every pair's probes and peaks from one child process,
``tests/run/memory_table.py``, each fresh process a fork of it); and a sweep whose case near
``--max-memory`` grows past it: the case runs in a watched worker, is killed, and becomes an
``oom`` row naming its estimate and the limit, while the sweep goes on."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from flyexplore.cache import entry_path  # noqa: E402
from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.ops import get_op  # noqa: E402
from flyexplore.ops.base import RunContext  # noqa: E402
from flyexplore.run import build as B  # noqa: E402
from flyexplore.run import memory as M  # noqa: E402
from flyexplore.run.plan import make_plan  # noqa: E402
from flyexplore.world import env as ENV  # noqa: E402

MB = 10 ** 6


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test with its own disk cache and an empty in-process one."""
    monkeypatch.setenv("FLYEXPLORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(M, "_FITS", {})


def _points(op, cases, dtype, fixed, factors):
    """Peaks of ``cases`` by a known rule (what a measurement would give if memory were linear)."""
    out = []
    for c in cases:
        f = M.features(op, c, dtype)
        out.append((c.label, f, int(fixed + sum(factors[r] * f[r] for r in M.ROLES))))
    return out


def _fitter(op, fixed, factors, calls=None):
    """A ``measure`` function for :func:`flyexplore.run.memory.estimate_cases`: each wanted fit from
    peaks by a known rule, stored as a measured one is (in place of the probe child)."""
    def run(o, wants, dev):
        res = {}
        for backend, dtype, probes in wants:
            key = M.fit_key(o, backend, dtype, M.device_kind(dev), probes)
            if calls is not None:
                calls.append(key)
            fit = M.fit_points(_points(o, probes, dtype, fixed, factors), key=key, op=o.name, backend=backend,
                               dtype=dtype, device=M.device_kind(dev), how="given")
            M.store_fit(fit)
            res[(backend, dtype, key)] = fit
        return res
    return run


# -- quick: scaling, fit and cache -------------------------------------------------------------------

def test_the_fit_recovers_a_fixed_term_and_a_factor_per_role_and_extrapolates():
    g = get_op("gemm")
    probes = M.probe_cases(g, g.case("8192x8192x8192"), "fp32")
    rule = {"input": 3.0, "output": 21.0, "work": 0.0}
    fit = M.fit_points(_points(g, probes, "fp32", 20 * MB, rule), extra_fixed=5 * MB, slack=1.0)
    assert fit.fixed == pytest.approx(25 * MB, rel=1e-3)
    assert fit.factors["input"] == pytest.approx(3.0, rel=1e-3) and fit.factors["output"] == pytest.approx(21.0, rel=1e-3)
    big = M.features(g, g.case("16x28672x4096"), "fp32")     # another shape, 100x the probes
    assert fit.predict(big) == pytest.approx(25 * MB + 3.0 * big["input"] + 21.0 * big["output"], rel=1e-3)
    slack = M.fit_points(_points(g, probes, "fp32", 20 * MB, rule), slack=1.25)
    assert slack.factors["output"] == pytest.approx(21.0 * 1.25, rel=1e-3) and slack.fixed == pytest.approx(20 * MB, rel=1e-3)
    with pytest.raises(ValueError, match="two measured points"):
        M.fit_points(_points(g, probes[:1], "fp32", 0, rule))


@pytest.mark.parametrize("op,a,b,dtype", [
    ("gemm", "8192x8192x8192", "16x28672x4096", "fp32"),
    ("gemm", "4096x4096x4096:TN", "64x512x8192:TN", "bf16"),
    ("rmsnorm", "8192x8192", "16x4096", "fp32"),
    ("topk", "4096x151936x50", "1x128256x50", "fp32"),
    ("grouped_gemm", "8x512x4096x1024", "8x96x128x256:ms=0/96/32/64/1/2/3/4", "bf16"),
    ("attention", "1x32x4096x4096x128:causal=1", "4x32x2048x2048x128:causal=1", "bf16"),
    ("scaled_gemm", "4096x4096x4096", "128x8192x1024", "mxfp4"),
])
def test_cases_of_one_structure_share_small_valid_probes(op, a, b, dtype):
    o = get_op(op)
    pa, pb = M.probe_cases(o, o.case(a), dtype), M.probe_cases(o, o.case(b), dtype)
    assert [c.label for c in pa] == [c.label for c in pb]            # one fit for both
    sizes = [sum(M.features(o, c, dtype).values()) for c in pa]
    assert sizes[0] <= M.PROBE_BYTES and max(sizes) <= 8 * M.PROBE_BYTES and sizes[0] == min(sizes)
    assert len(pa) >= 1 + sum(1 for v in M.features(o, pa[0], dtype).values() if v)   # enough points to fit
    for c in pa:
        assert o.case(c.label) == c                                    # valid cases of the operator
    assert o.case(a) not in pa


@pytest.mark.parametrize("op,shape,dtype", [("gemm", "4096x1024x2048:NT", "fp32"), ("topk", "1024x4096x64", "fp32"),
                                            ("attention", "1x8x1024x2048x64", "bf16"), ("rmsnorm", "16x4096", "fp32")])
def test_a_case_is_resized_to_a_target_size_keeping_its_options_and_proportions(op, shape, dtype):
    o = get_op(op)
    case = o.case(shape)
    for target in (4 << 20, 24 << 20, 200 << 20):
        c = M.resize(o, case, dtype, target)
        size = sum(M.features(o, c, dtype).values())
        assert target / 2 < size <= target, (c.label, size)
        assert {k: v for k, v in c.p.items() if k not in o.dims} == {k: v for k, v in case.p.items() if k not in o.dims}
        groups = [g for g in (o.memory_dims(case)[0] if o.memory_dims else [(d,) for d in o.dims])]
        scaled = [g[0] for g in groups if case[g[0]] > M.PROBE_MIN_DIM]
        for a in scaled:                  # every ratio of scaled dims within 2x of the case's
            for b in scaled:
                assert 0.5 <= (c[a] / c[b]) / (case[a] / case[b]) <= 2, (c.label, a, b)


def test_the_structure_is_what_picks_kernels_and_memory_patterns():
    a = get_op("attention")
    fwd = M.probe_cases(a, a.case("1x8x1024x1024x64"), "fp32")
    assert M.probe_cases(a, a.case("1x8x1024x1024x64:bwd"), "fp32") != fwd         # the pass
    assert M.probe_cases(a, a.case("1x8x1024x1024x128"), "fp32") != fwd            # the head dim
    causal = M.probe_cases(a, a.case("1x8x1024x1024x64:causal=1"), "fp32")
    assert all(c["sq"] == c["skv"] for c in causal)                                 # causal keeps SQ == SKV
    t = get_op("topk")
    assert {c["k"] for c in M.probe_cases(t, t.case("4096x151936x50"), "fp32")} == {50}   # K kept


def test_fits_are_kept_in_this_process_and_on_disk_and_a_damaged_file_is_ignored(tmp_path, monkeypatch):
    g = get_op("gemm")
    probes = M.probe_cases(g, g.case("1024x1024x1024"), "fp32")
    key = M.fit_key(g, "aten", "fp32", "cpu", probes)
    assert M.cached_fit(key) is None
    fit = M.fit_points(_points(g, probes, "fp32", 10 * MB, {"input": 2, "output": 9, "work": 0}), key=key, op="gemm",
                       backend="aten", dtype="fp32", device="cpu", how="given")
    M.store_fit(fit)
    files = list((tmp_path / "cache" / "memory").glob("*.json"))
    assert len(files) == 1 and not list((tmp_path / "cache" / "memory").glob(".fit-*"))
    monkeypatch.setattr(M, "_FITS", {})                                # another process: read from disk
    back = M.cached_fit(key)
    assert back is not None and back.factors == fit.factors and back.fixed == fit.fixed
    assert M.cached_fit(key.replace("fp32", "bf16")) is None           # another dtype: another fit
    monkeypatch.setattr(M, "_FITS", {})
    files[0].write_text("{not json")
    assert M.cached_fit(key) is None
    files[0].write_text(json.dumps({**fit.to_json(), "key": "someone else's"}))
    assert M.cached_fit(key) is None
    monkeypatch.setenv("FLYEXPLORE_CACHE", "off")
    M.store_fit(fit)                                                   # kept in this process only
    assert M.cached_fit(key) is fit and entry_path("memory", key) is None


# -- quick: the guard's decisions ------------------------------------------------------------------------

def _fake(free, source="fake reader"):
    return lambda device: (free, source)


def test_a_case_over_the_limit_by_its_measured_peak_is_refused_with_the_new_terms():
    plan = make_plan("rmsnorm", shapes="4096x4096;256x256", dtypes="fp32", backends="aten")
    rule = {"input": 4.0, "output": 14.0, "work": 0.0}
    got = M.memory_check(plan, "cpu", 10 ** 9, reader=_fake(None), measure=_fitter(plan.op, 20 * MB, rule))
    est = 20 * MB + 18.0 * 4096 * 4096 * 4 + 4.0 * 4096 * 4
    assert list(got.refused) == [("4096x4096", "fp32")]
    assert got.refused[("4096x4096", "fp32")] == (
        f"estimated memory {M._sci(est)} (inputs 6.7e7 B x 4.0, output 6.7e7 B x 14.0, fixed 2.0e7 B: aten's peak "
        "on 4 small cases) is over max_memory (--max-memory) 1.0 GB")
    # the lower bound alone (inputs and output) is 1.3e8 B: the old guard let it run
    assert M.case_memory(plan.op, plan.pairs[0][0], "fp32", flush_bytes=0) < 10 ** 9 < est
    assert ("256x256", "fp32") not in got.near            # 5e7 B: far below half the limit


def test_a_case_over_half_the_limit_is_near_and_one_far_below_it_is_never_measured():
    plan = make_plan("rmsnorm", shapes="2048x2048;64x64", dtypes="fp32", backends="aten,inductor")
    calls = []
    rule = {"input": 4.0, "output": 14.0, "work": 0.0}
    got = M.memory_check(plan, "cpu", 600 * MB, reader=_fake(None), measure=_fitter(plan.op, 20 * MB, rule, calls))
    assert got.refused == {} and list(got.near) == [("2048x2048", "fp32")]
    est = got.near[("2048x2048", "fp32")]
    # the largest backend's peak (the two fits alike here)
    assert est.total == pytest.approx(20 * MB + 18.0 * 2048 * 2048 * 4 + 4.0 * 2048 * 4, rel=1e-3)
    assert len(calls) == 2                                 # one fit per backend, the 64x64 case never asks
    calls.clear()
    M.memory_check(plan, "cpu", 600 * MB, reader=_fake(None), measure=_fitter(plan.op, 20 * MB, rule, calls))
    assert calls == []                                     # cached
    guard = M.Guard.of(got, ("2048x2048", "fp32"))
    assert guard.limit == 600 * MB and guard.estimate == est.total and "max_memory (--max-memory) 600.0 MB" in guard.said


def test_a_case_that_cannot_be_measured_is_not_refused_but_runs_guarded_with_a_note():
    plan = make_plan("rmsnorm", shapes="2048x2048", dtypes="fp32", backends="aten")

    def broken(o, wants, dev):
        return {(b, d, M.fit_key(o, b, d, "cpu", p)): f"{b} {d} not measured: probe child died"
                for b, d, p in wants}

    got = M.memory_check(plan, "cpu", 10 ** 9, reader=_fake(None), measure=broken)
    assert got.refused == {} and got.near[("2048x2048", "fp32")].source == "bound"
    assert got.notes == ["memory of rmsnorm aten fp32 not measured: probe child died"]
    with pytest.raises(UsageError, match="every case of the plan is over the memory limit"):
        M.memory_check(plan, "cpu", 10 ** 6, reader=_fake(None), measure=broken)   # its lower bound is over


def test_the_cpu_allocators_failure_is_an_oom_row():
    with pytest.raises(RuntimeError) as e:
        torch.empty(10 ** 15, dtype=torch.uint8)          # 1 PB: refused by the allocator, nothing touched
    assert B.is_oom(e.value)
    assert B.failure(e.value, RunContext(torch.device("cpu"), None))["status"] == "oom"
    assert not B.is_oom(ValueError("shapes do not match"))


# -- slow: against real peaks, and a real death --------------------------------------------------------

#: Every (family, backend) that runs on the CPU, with a dtype and a case structure (not square:
#: the roles' factors must each be right).
CPU_PAIRS = [
    ("gemm", "aten", "fp32", "4096x1024x2048:NT"), ("gemm", "inductor", "fp32", "4096x1024x2048:NT"),
    ("grouped_gemm", "aten", "fp32", "4x2048x1024x1024"), ("grouped_gemm", "reference", "fp32", "4x2048x1024x1024"),
    ("rmsnorm", "aten", "fp32", "4096x1024"), ("rmsnorm", "inductor", "fp32", "4096x1024"),
    ("topk", "aten", "fp32", "1024x4096x64"), ("topk", "inductor", "fp32", "1024x4096x64"),
    ("scaled_gemm", "emulated", "mxfp8", "1024x1024x2048"),
    ("scaled_gemm", "aten", "fp8_e4m3", "1024x1024x2048:scaling=row"),
    ("attention", "flash", "fp32", "1x8x1024x2048x64"), ("attention", "math", "fp32", "1x8x1024x2048x64"),
    ("attention", "default", "fp32", "1x8x1024x2048x64"),
]
#: Declared bytes of the checked cases: at most 24 MiB (peaks of 150-500 MB), none of them a probe.
CHECK_BYTES = 24 << 20
#: ... but 48 MiB for the scaled GEMMs: what their first case costs a process once (100-190 MB in
#: fresh children here, the fit's fixed term) is most of a 24 MiB case's peak, and one fresh
#: process's draw of it against another's read 0.60-0.68x there in CI; at 48 MiB 0.74-0.87x
#: (``data/cpu/memory_estimate``). Over-estimates both: the guard refuses early, never late.
CHECK_BYTES_BY_FAMILY = {"scaled_gemm": 48 << 20}


def test_the_suites_sample_of_memory_pairs_is_among_them():
    assert SUITE_PAIRS <= {(f, b) for f, b, _, _ in CPU_PAIRS}


@pytest.mark.slow
def test_every_cpu_family_and_backend_is_covered():
    ctx = RunContext(torch.device("cpu"), ENV.collect())
    from flyexplore.ops import builtin_ops

    runs = set()
    for name in builtin_ops():
        o = get_op(name)
        if o.memory is not None:
            continue   # a family that estimates its own memory (the model family): no probe, no fit
        for b, bk in o.backends.items():
            if any(bk.available(ctx, c, d) is None for c in o.suites["cpu-small"].cases for d in o.dtypes):
                runs.add((name, b))
    assert runs == {(f, b) for f, b, _, _ in CPU_PAIRS}


#: The pairs the suite checks every run: one per kind of memory pattern (a GEMM eager and compiled,
#: grouped GEMM, TopK, SDPA). The others are checked by ``benchmarks/evidence/memory_estimate.py``
#: (``data/cpu/memory_estimate``), and here with ``FLYEXPLORE_TEST_ALL_MEMORY=1`` (then they are
#: parameters of the test below too; else they are not collected at all).
SUITE_PAIRS = {("gemm", "aten"), ("gemm", "inductor"), ("grouped_gemm", "aten"), ("topk", "aten"),
               ("attention", "default")}
#: The pairs measured and checked here: in one child process, about 65 CPU-s for the suite's 5 on the
#: 2-core machine (each pair in child processes of its own before: 130 CPU-s), 240 CPU-s for all 13.
MEASURED_PAIRS = [p for p in CPU_PAIRS if (p[0], p[1]) in SUITE_PAIRS
                  or os.environ.get("FLYEXPLORE_TEST_ALL_MEMORY") == "1"]


def _measure_in_one_child(pairs) -> dict:
    """``tests/run/memory_table.py`` run once for ``pairs``: ``{"rows": {"family/backend": row},
    "exit": its exit code, "stderr": the end of its stderr}``."""
    from conftest import ROOT
    from tests.run.memory_table import MARK

    req = [[f, b, d, s, CHECK_BYTES_BY_FAMILY.get(f, CHECK_BYTES)] for f, b, d, s in pairs]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "tests.run.memory_table"], input=json.dumps(req), capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=1500)
    rows = [json.loads(ln[len(MARK):]) for ln in r.stdout.splitlines() if ln.startswith(MARK)]
    return {"rows": {f"{x['family']}/{x['backend']}": x for x in rows}, "exit": r.returncode,
            "stderr": r.stderr[-3000:]}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The estimate and the real peak of every pair of :data:`MEASURED_PAIRS`, measured in ONE
    child process (``tests/run/memory_table.py``: each probe child and each checked case still a
    fresh process, a fork of it, instead of a new interpreter each), once a session: the
    pytest-xdist workers share the table through a file beside their temporary folders."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    table = root / "memory_table.json"
    with open(root / "memory_table.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)       # one worker measures; the others wait and read
        if not table.exists():
            table.write_text(json.dumps(_measure_in_one_child(MEASURED_PAIRS)))
    return json.loads(table.read_text())


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fam,backend,dtype,structure", MEASURED_PAIRS,
                         ids=[f"{f}-{b}" for f, b, _, _ in MEASURED_PAIRS])
def test_the_estimate_is_within_1_5x_of_the_measured_peak_for_every_cpu_family_and_backend(measured, fam, backend,
                                                                                           dtype, structure):
    """Each case run as a sweep runs it, alone in a fresh process (the allocator as a sweep has
    it), against the estimate from its probes (fitted into an empty cache); every pair measured in
    one child (:func:`measured`), each test reading its own pair's row."""
    op = get_op(fam)
    case = M.resize(op, op.case(structure), dtype, CHECK_BYTES_BY_FAMILY.get(fam, CHECK_BYTES))
    assert case not in M.probe_cases(op, case, dtype)
    got = measured["rows"].get(f"{fam}/{backend}")
    assert got is not None, f"not measured (exit {measured['exit']}): {measured['stderr']}"
    assert got["case"] == case.label and got["dtype"] == dtype, got
    assert got["estimate"] is not None, got["notes"]
    assert got["status"] == ["ok"], got
    ratio = got["peak"] / got["estimate"]
    seen = (f"{fam} {backend} {case.label}: {got['peak'] / MB:.0f} MB measured / "
            f"{got['estimate'] / MB:.0f} MB estimated = {ratio:.2f}")
    assert 1 / 1.5 <= ratio <= 1.5, seen


@pytest.mark.slow
def test_a_case_near_the_limit_runs_in_a_watched_worker_and_dying_there_is_an_oom_row(tmp_path, monkeypatch):
    """An in-process CPU sweep with --max-memory 400 MB: 256x256 runs here; 1024x1024 (real peak
    about 120 MB) and 4096x2048 (about 800 MB) are near the limit by their estimates -- a fit given
    to the cache, below 4096x2048's real peak as an underestimate would be -- so each runs in a
    worker process; 4096x2048 really grows past 400 MB there, is killed, and is an oom row naming
    its estimate and the limit. The sweep finishes."""
    from flyexplore.cli import main
    from flyexplore.results import table as R

    op = get_op("rmsnorm")
    probes = M.probe_cases(op, op.case("1024x1024"), "fp32")         # one structure: one fit for the three
    key = M.fit_key(op, "aten", "fp32", M.device_kind("cpu"), probes)
    # 190 MB + 1.7 x declared: 256x256 190.9 MB (under half the limit), 1024x1024 204.3 MB and
    # 4096x2048 304.1 MB (over half)
    M.store_fit(M.Fit(key, "rmsnorm", "aten", "fp32", "cpu", 190e6, {"input": 1.7, "output": 1.7, "work": 0.0},
                      (), "given"))
    out = tmp_path / "r.csv"
    rc = main(["sweep", "--op", "rmsnorm", "--shapes", "256x256;1024x1024;4096x2048", "--dtypes", "fp32",
               "--backends", "aten", "--rep", "2", "--warmup", "1", "--max-memory", "400MB", "--out", str(out)])
    assert rc == 0
    df = R.load(out)
    rows = {r["case"]: r for _, r in df.iterrows()}
    assert rows["256x256"]["status"] == "ok" and rows["256x256"]["worker"] == "in-process"
    assert rows["1024x1024"]["status"] == "ok" and str(rows["1024x1024"]["worker"]).startswith("cpu0/pid")
    dead = rows["4096x2048"]
    assert dead["status"] == "oom", dead["message"]
    assert "past the limit, max_memory (--max-memory) 400.0 MB" in dead["message"]
    assert "estimated 304.1 MB (measured)" in dead["message"] and "killed (SIGKILL)" in dead["message"]
    assert os.environ["FLYEXPLORE_CACHE"] == str(tmp_path / "cache")

"""A case's memory, estimated from what really runs, and the guard built on it.

The tensors an operator declares (its ``tensors`` hook, :meth:`~flyexplore.ops.base.Operator.tensor_sizes`)
are a small part of what a case holds at its peak: on the CPU the reference is float64 (GEMM:
A, B, A @ B and |A| @ |B| as well), the check works in float64 on every element (the bound, the
difference, masks), the recheck builds a second reference on fresh inputs, Inductor compiles.
The sum of inputs and one output (:func:`case_memory`, the old estimate and still the lower
bound) was about 8x below the peak (rmsnorm 8192x8192 fp32: 0.54 GB against 4.94 GB; gemm
8192^3 fp32: 0.81 GB against 6.57 GB); the measured estimate says 6.3 GB and 8.6 GB.

So the estimate is **measured**. For each (operator, backend, dtype, device kind, probe
structure) a few small cases -- the *probes* (:func:`probe_cases`: the case shrunk to about
:data:`PROBE_BYTES` of declared tensors, then each group of dims grown :data:`PROBE_GROW`-fold) --
are run exactly as a sweep runs a case (:func:`flyexplore.run.cases.run_case`: inputs,
reference, build, first call and check, timing rounds, fresh inputs and the recheck) in a
child process, under a peak-memory probe (:mod:`flyexplore.run.memprobe`):

- CPU: the growth of the resident set over the case, ``VmHWM`` after ``VmRSS`` (Linux: the
  high-water mark is reset per case by writing ``5`` to ``/proc/self/clear_refs``, so one child
  measures every probe). ``tracemalloc`` does not see torch's allocations (a 4096x4096 fp32
  ``randn`` and its float64 copy: 0.0006 MB traced against 201 MB allocated, torch 2.15), and
  ``ru_maxrss`` cannot be reset (one child per probe, 16 s each here). The child fixes glibc's
  mmap threshold at 128 KiB (:data:`TIDY_MMAP_THRESHOLD`) and hands freed memory back before
  each probe (``malloc_trim(0)``), so that a probe counts what it holds live, not pages a
  previous one left (with glibc as it comes, rmsnorm 1024x1024 fp32 run twice measured 100 MB,
  then -0.2 MB). A large case's tensors are mmapped anyway (glibc's threshold stops at 32 MiB);
  what glibc keeps resident of smaller freed blocks in a sweep's process is
  :data:`ALLOCATOR_SLACK`, and what a process's first case costs once is measured in a fresh
  child as a sweep has it (:func:`measure_fits`). Inductor's caches are off in the probes' child
  (a cache hit compiles with less memory than a new shape).
- GPU: ``torch.cuda.max_memory_reserved`` after ``reset_peak_memory_stats`` (what the caching
  allocator took from the device, the flush buffer included), plus the CUDA/HIP context (the
  device's free memory before and after the child created it, :func:`flyexplore.measure.devstate.free_memory`).

Each probe's peak is fitted as ``fixed + sum over roles of factor x declared bytes`` (roles:
``input``, ``output``, ``work``; non-negative least squares on relative errors,
``scipy.optimize.nnls``), and a case's estimate is that fit at its declared bytes: the
largest over its backends (they share inputs, reference and check; one runs at a time).
Fits are cached in this process and on disk (:mod:`flyexplore.cache`, a JSON file per
fit keyed by torch and flyexplore versions, the device and the probes' labels; ``FLYEXPLORE_CACHE=off``
disables it). Accuracy: ``tests/run/test_memory.py`` holds the estimate within 1.5x of the
measured peak for every (family, backend) that runs on the CPU, and
``benchmarks/evidence/memory_estimate.py`` tabulates it (``data/cpu/memory_estimate``).

Cheap: a probe runs only when a decision depends on it. A case whose lower bound (inputs and
one output) is over the limit is refused as it is; one whose generous upper bound
(:func:`upper_bound`: :data:`PRIOR_FIXED` plus :data:`PRIOR_BYTES_PER_ELEMENT` per element of
its declared tensors) is under :data:`NEAR_LIMIT` of the limit can neither be refused nor run in
a child, and is not measured. Only the cases between are: once per fit (per machine, with the
disk cache), in one child process for the whole plan, and on the CPU one more fresh child per fit
(about 16 s to start each here: ``import torch``, flyexplore and the environment).

What the estimate drives (:func:`memory_check`): a case over the limit (the smaller of the
device's free memory and ``--max-memory``) becomes a ``refused`` row; a CPU case over
:data:`NEAR_LIMIT` of it runs in a child process (:mod:`flyexplore.run.engine`), watched: past the
limit it is killed and becomes an ``oom`` row, as does one the kernel's OOM killer takes.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from flyexplore import cache as disk_cache
from flyexplore._version import __version__
from flyexplore.errors import UsageError
from flyexplore.measure.devstate import free_memory
from flyexplore.measure.timing import MIN_FLUSH_BYTES, flush_bytes_for
from flyexplore.ops.base import DTYPE_BYTES, Case, Operator
from flyexplore.run.plan import Plan, op_ref

#: A case whose estimate is over this fraction of the memory limit is "near" it: on the CPU it runs
#: in a child process (the engine's worker), not in the sweep's own (the OOM killer would take the
#: sweep with it).
NEAR_LIMIT = 0.5
#: Declared bytes (inputs, output, intermediates) of the smallest probe case: about 4 MiB, whose
#: peak is some 50-300 MB on the CPU (the resident set's noise between runs is a few MB) and whose
#: check takes a second or two on a small CPU.
PROBE_BYTES = 4 << 20
#: Every scaled dim starts here before a probe is shrunk to :data:`PROBE_BYTES` (one start for every
#: case of a structure: one set of probes, one fit).
PROBE_START = 4096
#: Each group of dims of a probe grows this much beyond the smallest probe (and all of them
#: twofold when more points are needed): peaks 4x apart pin the factors.
PROBE_GROW = 4
#: A dim is not shrunk below this (nor below its own value) for a probe: kernels keep their
#: alignment (every power of two and 16 x odd stays a multiple of 16 down to 64).
PROBE_MIN_DIM = 64
#: The upper bound of a case not measured (:func:`upper_bound`): bytes per element of its declared
#: tensors. The largest measured factor on the CPU (``data/cpu/memory_estimate/fits.json``) is 108
#: bytes per output element (grouped GEMM fp32: the float64 reference, |A| @ |B| and the check's
#: float64 temporaries, with :data:`ALLOCATOR_SLACK`); 192 leaves 1.8x.
PRIOR_BYTES_PER_ELEMENT = 192
#: ... and fixed bytes: the largest fitted fixed term on the CPU is 0.18 GB (Inductor's compile in
#: a fresh process); a GPU adds its context (0.5 GB on an H200) and the flush buffer.
PRIOR_FIXED = {"cpu": 1 << 30, "cuda": 2 << 30}
#: The probe's timer: two timed rounds after one warm-up (the peak of a round does not depend on
#: how many there are).
PROBE_TIMER = {"rep": 2, "warmup": 1}
#: glibc's mmap threshold in the probe child (``MALLOC_MMAP_THRESHOLD_``), bytes: every block from
#: 128 KiB is mmapped and given back when freed, as every block from 32 MiB is by default.
TIDY_MMAP_THRESHOLD = 128 << 10
#: The CPU fits' factors are multiplied by this. The probes measure with every block over 128 KiB
#: mmapped (:data:`TIDY_MMAP_THRESHOLD`): what the case holds live at its peak, and what a large
#: case holds (glibc mmaps blocks over 32 MiB anyway: rmsnorm 8192x8192 fp32 peaked at 9.2x its
#: declared bytes, the probes' fit says 9.4x). In a sweep's process glibc keeps some freed blocks
#: resident: rmsnorm 2048x2048 and 4096x4096 fp32 peaked at 12.0-12.6x (1.28-1.34x the live
#: peak). 1.25 keeps both within 1.25x (``data/cpu/memory_estimate``).
ALLOCATOR_SLACK = 1.25
#: Seconds a probe case may take in its child (compile included) before the child is killed.
PROBE_CASE_TIMEOUT_S = 120.0
#: Starts of a probe child for one plan (a child that dies takes its current case with it; the
#: next one goes on with the rest).
PROBE_ATTEMPTS = 3
#: Part of every cache key: a change of how probes are made or fitted makes new fits.
MODEL_VERSION = 1
#: Roles of declared tensors (:class:`flyexplore.ops.base.TensorSize`) and their names in messages.
ROLES = ("input", "output", "work")
ROLE_TERMS = {"input": "inputs", "output": "output", "work": "intermediates"}


# -- declared sizes ----------------------------------------------------------------------------------

def features(op: Operator, case: Case, dtype: str) -> dict[str, int]:
    """Declared bytes of ``case`` per role (``input``, ``output``, ``work``): the operator's
    ``tensors`` hook summed by role, or for an operator without one its ``op.bytes`` as
    ``input`` (0 without). Pure Python, exact past int64; raises
    :class:`~flyexplore.errors.UsageError` for a tensor past int64 (as the plan does)."""
    sizes = op.tensor_sizes(case, dtype)
    if sizes:
        return {r: sum(t.nbytes for t in sizes if t.role == r) for r in ROLES}
    try:
        nbytes = int(op.bytes(case, dtype)) if callable(op.bytes) else 0
    except Exception:  # noqa: BLE001 - an operator without a byte count: nothing declared
        nbytes = 0
    return {"input": max(nbytes, 0), "output": 0, "work": 0}


def case_memory_terms(op: Operator, case: Case, dtype: str, *, flush_bytes: int = MIN_FLUSH_BYTES) -> dict[str, int]:
    """The lower bound of a case's memory, in bytes, by term, in this order:

    - ``inputs``: the tensors ``op.make_inputs`` builds, held for the whole case -- the ``input``
      entries of :meth:`~flyexplore.ops.base.Operator.tensor_sizes` (storage shape x bytes per
      element, e.g. GEMM A [M, K] and B [K, N]);
    - ``output``: what one backend call returns (its ``output`` entries, e.g. GEMM [M, N]);
    - ``intermediates``: its ``work`` entries (attention's scores [B, H, SQ, SKV], which the
      reference builds), left out when there are none;
    - ``flush buffer``: ``flush_bytes``, the timers' cache-flush buffer (on a GPU
      :func:`~flyexplore.measure.timing.flush_bytes_for` the device, at least
      :data:`~flyexplore.measure.timing.MIN_FLUSH_BYTES`, the default here; none on the CPU), left
      out when 0.

    An operator without a ``tensors`` hook: ``op.bytes(case, dtype)`` as ``inputs and output``
    (0 without). Each of these is allocated, so a case over a limit by this sum cannot run; the
    real peak is several times more (:func:`estimate_case`). Raises
    :class:`~flyexplore.errors.UsageError` for a tensor past int64."""
    if op.tensor_sizes(case, dtype):
        f = features(op, case, dtype)
        terms = {"inputs": f["input"], "output": f["output"]}
        if f["work"]:
            terms["intermediates"] = f["work"]
    else:
        terms = {"inputs and output": features(op, case, dtype)["input"]}
    if flush_bytes:
        terms["flush buffer"] = int(flush_bytes)
    return terms


def case_memory(op: Operator, case: Case, dtype: str, *, flush_bytes: int = MIN_FLUSH_BYTES) -> int:
    """The lower bound of the bytes ``case`` in ``dtype`` needs: the sum of
    :func:`case_memory_terms` (declared inputs, one output, intermediates, the flush buffer). Pure
    Python, exact past int64, nothing allocated. The estimate of what it really takes is
    :func:`estimate_case`."""
    return sum(case_memory_terms(op, case, dtype, flush_bytes=flush_bytes).values())


def declared_elements(op: Operator, case: Case, dtype: str) -> int:
    """Elements of the declared tensors: their bytes over the dtype's bytes per element (packed
    FP4: two per byte), at least their bytes' count in the dtype's elements."""
    per = DTYPE_BYTES.get(dtype, 1) or 1
    return int(math.ceil(sum(features(op, case, dtype).values()) / per))


def upper_bound(op: Operator, case: Case, dtype: str, kind: str) -> int:
    """A generous bound on ``case``'s peak when it is not measured: :data:`PRIOR_FIXED` of the
    device kind (``cpu``/``cuda``) plus :data:`PRIOR_BYTES_PER_ELEMENT` per declared element
    (:func:`declared_elements`). Used only to skip the probe of a case far below the limit."""
    return PRIOR_FIXED.get(kind, PRIOR_FIXED["cuda"]) + PRIOR_BYTES_PER_ELEMENT * declared_elements(op, case, dtype)


# -- probes --------------------------------------------------------------------------------------------

def _groups(op: Operator, case: Case) -> tuple[tuple[tuple[str, ...], ...], dict]:
    if op.memory_dims is not None:
        groups, fixed = op.memory_dims(case)
        return tuple(tuple(g) for g in groups), dict(fixed)
    return tuple((d,) for d in op.dims), {}


def _valid(op: Operator, params: dict) -> Case | None:
    try:
        return op.make_case(**params)
    except UsageError:
        return None


def resize(op: Operator, case: Case, dtype: str, target: int) -> Case:
    """``case`` with the params ``op.memory_dims`` sets and its scaled dims (its groups; default:
    each dim alone) halved together while its declared bytes are over ``target``, then doubled
    together, then each group once, the smallest first, while they stay within it: the
    proportions kept within 2x, no dim below
    :data:`PROBE_MIN_DIM` (or its own value; a dim there stays while the others move), every
    step a valid case. A case that cannot shrink stays as large as it is."""
    groups, fixed = _groups(op, case)
    dims = [d for g in groups for d in g]
    cur = _valid(op, {**case.p, **fixed}) or case
    size = lambda c: sum(features(op, c, dtype).values())  # noqa: E731
    while size(cur) > target:
        p = dict(cur.p)
        q = {**p, **{d: max(-(-p[d] // 2), min(case[d], PROBE_MIN_DIM)) for d in dims}}
        c = _valid(op, q)
        if c is None or q == p:
            break
        cur = c
    while True:
        c = _valid(op, {**cur.p, **{d: cur[d] * 2 for d in dims}})
        if c is None or size(c) > target:
            break
        cur = c
    for i in sorted(range(len(groups)), key=lambda j: min(cur[d] for d in groups[j])):
        c = _valid(op, {**cur.p, **{d: cur[d] * 2 for d in groups[i]}})   # then each group once at most
        if c is not None and size(c) <= target:
            cur = c
    return cur


def probe_cases(op: Operator, case: Case, dtype: str) -> list[Case]:
    """The small cases whose peaks give ``case``'s fit, smallest first.

    The first: ``case`` with every scaled dim :data:`PROBE_START` (and the params
    ``op.memory_dims`` sets: attention B = 1, grouped GEMM even groups), shrunk by :func:`resize`
    to :data:`PROBE_BYTES` of declared tensors. Then one case per
    group of scaled dims (``op.memory_dims``; default: each dim alone) with that group's dims
    :data:`PROBE_GROW` x the first's, and -- while there are fewer cases than fitted terms plus
    one -- every group 2, 3, 6 x the first's. Variants the operator refuses (``validate``) are left
    out. The cases depend only on what the probes keep of ``case`` (the dims not scaled, the
    options), so that cases of one structure (every GEMM of a layout) share them and their fit."""
    groups, fixed = _groups(op, case)
    start = {**case.p, **fixed, **{d: PROBE_START for g in groups for d in g}}
    base = resize(op, _valid(op, start) or case, dtype, PROBE_BYTES)
    p = dict(base.p)
    out = [base]
    for g in groups:
        c = _valid(op, {**p, **{d: p[d] * PROBE_GROW for d in g}})
        if c is not None and c not in out:
            out.append(c)
    terms = 1 + sum(1 for v in features(op, base, dtype).values() if v)
    for k in (2, 3, 6):
        if len(out) >= terms + 1:
            break
        c = _valid(op, {**p, **{d: p[d] * k for g in groups for d in g}})
        if c is not None and c not in out:
            out.append(c)
    return out


# -- fits -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fit:
    """The measured memory of one (operator, backend, dtype, device kind, probe structure):
    ``peak = fixed + sum(factors[role] x declared bytes of role)`` in bytes, from ``points``
    (``(case label, {role: declared bytes}, measured peak bytes)``) measured ``how``."""

    key: str
    op: str
    backend: str
    dtype: str
    device: str
    fixed: float
    factors: Mapping[str, float]
    points: tuple
    how: str

    def predict(self, feats: Mapping[str, int]) -> float:
        """The peak, bytes, of a case with declared bytes ``feats`` (:func:`features`)."""
        return self.fixed + sum(self.factors.get(r, 0.0) * feats.get(r, 0) for r in ROLES)

    def to_json(self) -> dict:
        return {"key": self.key, "op": self.op, "backend": self.backend, "dtype": self.dtype, "device": self.device,
                "fixed": self.fixed, "factors": dict(self.factors), "points": [list(p) for p in self.points],
                "how": self.how, "model_version": MODEL_VERSION}

    @classmethod
    def from_json(cls, d: Mapping) -> Fit:
        """A fit read back; raises ``KeyError``/``TypeError``/``ValueError`` for a damaged one."""
        fixed = float(d["fixed"])
        factors = {r: float(d["factors"][r]) for r in ROLES}
        if d.get("model_version") != MODEL_VERSION or not all(math.isfinite(v) and v >= 0
                                                               for v in (fixed, *factors.values())):
            raise ValueError("not a fit of this model")
        pts = tuple((str(a), {r: int(b[r]) for r in ROLES}, int(c)) for a, b, c in d["points"])
        return cls(str(d["key"]), str(d["op"]), str(d["backend"]), str(d["dtype"]), str(d["device"]), fixed, factors,
                   pts, str(d["how"]))


def fit_points(points, *, key: str = "", op: str = "", backend: str = "", dtype: str = "", device: str = "",
               how: str = "", extra_fixed: float = 0.0, slack: float = 1.0) -> Fit:
    """Fit ``fixed`` and one factor per role to ``points`` (``(label, {role: bytes}, peak)``):
    non-negative least squares on relative errors (each point's row divided by its peak;
    ``scipy.optimize.nnls``), so that small and large probes count alike and no term is negative.
    Roles no point declares get factor 0. ``extra_fixed`` (a process's one-time costs, a GPU's
    context) is added to ``fixed``; the factors are multiplied by ``slack`` (:data:`ALLOCATOR_SLACK`
    on the CPU). Raises ``ValueError`` for fewer than two points."""
    import numpy as np
    from scipy.optimize import nnls

    pts = [(str(lab), {r: int(f.get(r, 0)) for r in ROLES}, int(pk)) for lab, f, pk in points]
    if len(pts) < 2:
        raise ValueError(f"a fit needs two measured points or more, got {len(pts)}")
    used = [r for r in ROLES if any(f[r] for _, f, _ in pts)]
    peaks = np.array([max(pk, 1) for _, _, pk in pts], dtype=float)
    a = np.array([[1.0] + [float(f[r]) for r in used] for _, f, _ in pts]) / peaks[:, None]
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)    # columns of like size: a stable solve
    sol, _ = nnls(a / scale, np.ones(len(pts)))
    sol = sol / scale
    factors = {r: 0.0 for r in ROLES}
    factors.update({r: float(v) * slack for r, v in zip(used, sol[1:])})
    return Fit(key, op, backend, dtype, device, float(sol[0]) + float(extra_fixed), factors, tuple(pts), how)


#: This process's fits by key (:func:`fit_key`); the disk cache holds them across processes.
_FITS: dict[str, Fit] = {}


def device_kind(device) -> str:
    """``cpu``, or ``cuda:<device name>`` (``torch.cuda.get_device_properties``: no context is
    created), or ``cuda`` when the name cannot be read."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    try:
        return f"cuda:{torch.cuda.get_device_properties(dev.index or 0).name}"
    except Exception:  # noqa: BLE001 - no name: one key for every GPU
        return "cuda"


def fit_key(op: Operator, backend: str, dtype: str, kind: str, probes) -> str:
    """The cache key of a fit: the model version, torch and flyexplore versions, the device kind,
    operator, backend, dtype and the probe cases' labels (they carry what a probe keeps of the
    case: dims not scaled, options)."""
    import torch

    return "|".join([f"v{MODEL_VERSION}", f"torch {torch.__version__}", f"flyexplore {__version__}", kind, op.name,
                     backend, dtype, ";".join(c.label for c in probes)])


def cached_fit(key: str) -> Fit | None:
    """The fit of ``key`` from this process, else from the disk cache (:mod:`flyexplore.cache`,
    kind ``memory``; a damaged or foreign file is ignored), else None."""
    if key in _FITS:
        return _FITS[key]
    data = disk_cache.read_entry("memory", key)
    if data is None:
        return None
    try:
        fit = Fit.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if fit.key != key:
        return None
    _FITS[key] = fit
    return fit


def store_fit(fit: Fit) -> None:
    """Keep ``fit`` in this process and write it to the disk cache (:mod:`flyexplore.cache`, kind
    ``memory``), whole or not at all (a reader sees the old file or the new one). A cache that
    cannot be written (a full disk, a read-only home) is skipped: the fit is measured again next
    time."""
    _FITS[fit.key] = fit
    disk_cache.write_entry("memory", fit.key, fit.to_json())


# -- measuring in a child -----------------------------------------------------------------------------------

#: The checkout holding the ``flyexplore`` package (put first on the probe child's path).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _exit(code) -> str:
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"


#: The prefix of the probe child's result lines on stdout (anything else there is ignored).
MARK = "flyexplore-memprobe "


def _unmeasured(why: str) -> dict:
    """A job's result when it has no peak (its child hung or died)."""
    return {"peak": None, "status": [], "message": why, "how": "", "context": 0, "seconds": None}


class ProbeError(RuntimeError):
    """No measurement: the probe child could not start or run (its reason in the message)."""


def _exec_probe_child(env_vars: dict) -> subprocess.Popen:
    """``python -m flyexplore.run.memprobe`` started with ``env_vars``: stdin, stdout and stderr text
    pipes, in a session of its own (a kill of its group takes its compile workers too)."""
    return subprocess.Popen([sys.executable, "-m", "flyexplore.run.memprobe"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_vars,
                            start_new_session=True)


#: How :func:`measure_cases` starts each probe child: ``f(env_vars) -> Popen`` (``pid``,
#: ``returncode``, ``communicate(input, timeout)``, ``wait()``). The default execs a new interpreter;
#: ``tests/run/memory_table.py`` puts a fork of its own process there (torch imported once for
#: many children: each child is still a fresh process that has run no case).
start_probe_child: Callable[[dict], Any] = _exec_probe_child


def measure_cases(op: Operator, jobs, device, *, timer: Mapping | None = None, tidy_malloc: bool = True,
                  fresh: bool = False, timeout_s: float = PROBE_CASE_TIMEOUT_S,
                  attempts: int = PROBE_ATTEMPTS) -> list[dict]:
    """Run ``jobs`` (``(case, dtype, backends)``) each as a sweep runs a case
    (:func:`flyexplore.run.cases.run_case`, ``timer`` default :data:`PROBE_TIMER`) in a child
    process (:mod:`flyexplore.run.memprobe`) and return one dict per job, in order: ``peak``
    (bytes over the case; None when it did not run), ``status`` (each backend's), ``how``
    (the probe), ``context`` (a GPU's context bytes, else 0), ``seconds``, ``message``.

    ``tidy_malloc``: the probes' child (see the module text): glibc's mmap threshold fixed at
    :data:`TIDY_MMAP_THRESHOLD`, and Inductor's caches off (``TORCHINDUCTOR_FORCE_DISABLE_CACHES``:
    every compile is a new shape's, as a sweep's case can be); else the allocator and caches as a
    sweep has them (a check against a real run). ``fresh``: each job in a child of its own (what a first case of a process takes, its
    one-time costs included), else one child for all. ``timeout_s``: per job; a child past it (``timeout_s``
    x its jobs, and a minute to start) is killed and every job not done gets ``peak`` None with
    the reason; a child that dies takes its current job with it, and a new one goes on with the
    rest, up to ``attempts`` deaths. Raises :class:`UsageError` for an operator a child cannot
    import (:func:`flyexplore.run.plan.op_ref`)."""
    if fresh and len(jobs) > 1:
        return [measure_cases(op, [j], device, timer=timer, tidy_malloc=tidy_malloc, timeout_s=timeout_s,
                              attempts=attempts)[0] for j in jobs]
    ref = op_ref(op)
    out: list[dict | None] = [None] * len(jobs)
    todo = list(range(len(jobs)))
    env_vars = dict(os.environ)
    if tidy_malloc:   # the probes: see the module text
        env_vars["MALLOC_MMAP_THRESHOLD_"] = str(TIDY_MMAP_THRESHOLD)
        env_vars["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    # the child imports this flyexplore and whatever module an operator came from, as this process does
    env_vars["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
        [str(_ROOT), *(p for p in env_vars.get("PYTHONPATH", "").split(os.pathsep) if p),
         *(p for p in sys.path if p and os.path.isdir(p))]))
    failures = 0
    while todo:
        req = {"op": ref, "device": str(device), "timer": dict(timer if timer is not None else PROBE_TIMER),
               "jobs": [[jobs[i][0].label, jobs[i][1], list(jobs[i][2])] for i in todo]}
        proc = start_probe_child(env_vars)
        why = None
        try:
            stdout, stderr = proc.communicate(json.dumps(req), timeout=60 + timeout_s * len(todo))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            stdout, stderr = proc.communicate()
            why = f"probe child ran past {timeout_s:g} s a case"
        except BaseException:   # Ctrl-C: the child (and its compile workers) go too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            proc.wait()
            raise
        got = [json.loads(ln[len(MARK):]) for ln in stdout.splitlines() if ln.startswith(MARK)]
        fatal = next((g["fatal"] for g in got if "fatal" in g), None)
        if fatal:
            raise ProbeError(f"memory probe could not start: {fatal}")
        rows = [g for g in got if "index" in g]
        for g in rows:
            out[todo[g["index"]]] = g
        done = {g["index"] for g in rows}
        rest = [i for k, i in enumerate(todo) if k not in done]
        if why is not None:   # a hang: the rest would likely hang too
            for i in rest:
                out[i] = _unmeasured(why)
            rest = []
        if rest and (proc.returncode != 0 or not rows):
            tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or [""]
            why = f"probe child died ({_exit(proc.returncode)}): {tail[0][:200]}"
            out[rest[0]] = _unmeasured(why)
            rest = rest[1:]
            failures += 1
            if failures >= attempts:
                for i in rest:
                    out[i] = _unmeasured(f"not measured: {attempts} probe children failed")
                rest = []
        todo = rest
    return out  # type: ignore[return-value]


def measure_fits(op: Operator, wants, device) -> dict[tuple[str, str, str], Fit | str]:
    """Measure and fit every ``(backend, dtype, probe cases)`` of ``wants`` not yet cached, and
    store the fits (:func:`store_fit`). Returns ``{(backend, dtype, key): Fit or the reason there
    is none}``.

    The probes of every fit run in one child process (:func:`measure_cases`), each fit's after a
    warm-up run of its first probe (what a process does once stays out of the fit). Then on the
    CPU each fit's largest probe runs again, alone in a fresh child with glibc and Inductor's
    caches as a sweep has them (a child per fit: about 16 s each here): its excess over the fit
    goes into the fixed term -- what a process's first case costs once (imports, thread pools,
    Inductor's compiler) and what glibc keeps resident of it under the case's own blocks (rmsnorm
    2048x1024 fp32 with inductor in a fresh process: 400 MB, against 258 MB with every block
    returned; aten: 258 MB against 178 MB). On a GPU the device's peaks are exact per job, and
    the warm-up's excess (cuBLAS's workspace, ...) and the context go there."""
    kind = device_kind(device)
    res: dict = {}
    jobs, where = [], []
    for backend, dtype, probes in wants:
        key = fit_key(op, backend, dtype, kind, probes)
        hit = cached_fit(key)
        if hit is not None:
            res[(backend, dtype, key)] = hit
            continue
        for c in (probes[0], *probes):   # the first: a warm-up
            jobs.append((c, dtype, (backend,)))
            where.append((backend, dtype, key))
    if not jobs:
        return res
    names = sorted({f"{b} {d}" for b, d, _ in where})
    print(f"flyexplore: measuring the memory of {op.name} ({', '.join(names)}) on {len(jobs)} small cases in a child "
          "process, for cases near the memory limit (once: kept in the cache)", file=sys.stderr, flush=True)
    try:
        got = measure_cases(op, jobs, device)
    except (ProbeError, UsageError) as exc:
        for w in set(where):
            res[w] = str(exc)
        return res
    by: dict = {}
    for (job, w, g) in zip(jobs, where, got):
        by.setdefault(w, []).append((job, g))
    made = {}
    for w, items in by.items():
        backend, dtype, key = w
        ok = [(job[0], g) for job, g in items[1:] if g["peak"] is not None and g["status"] == ["ok"]]
        pts = [(c.label, features(op, c, dtype), g["peak"]) for c, g in ok]
        if len(pts) < 2:
            bad = next((g for _, g in items if g["status"] != ["ok"] or g["peak"] is None), items[0][1])
            res[w] = (f"{backend} {dtype} not measured: " + (bad.get("message") or ", ".join(bad["status"]) or "no peak"))
            continue
        warm = items[0]     # (warm-up job, its result)
        big = max((c for c, _ in ok), key=lambda c: sum(features(op, c, dtype).values()))
        made[w] = (pts, (warm[0][0], warm[1]), big, ok[0][1])
    # what a process's first case costs once: on a GPU the warm-up's excess; on the CPU the largest
    # probe's, alone in a fresh child with glibc and Inductor's caches as a sweep has them
    firsts = [warm for _, (_, warm, _, _) in made.items()]
    if kind == "cpu" and made:
        with contextlib.suppress(ProbeError, UsageError):
            got = measure_cases(op, [(big, w[1], (w[0],)) for w, (_, _, big, _) in made.items()], device,
                                tidy_malloc=False, fresh=True)
            firsts = [(big, g) for (_, (_, _, big, _)), g in zip(made.items(), got)]
    for (w, (pts, _, _, g)), (c0, first) in zip(made.items(), firsts):
        backend, dtype, key = w
        raw = fit_points(pts).predict(features(op, c0, dtype))
        once = max(first["peak"] - raw, 0.0) if first.get("peak") is not None and first.get("status") == ["ok"] else 0.0
        fit = fit_points(pts, key=key, op=op.name, backend=backend, dtype=dtype, device=kind, how=g["how"],
                         extra_fixed=once + max(int(g.get("context") or 0), 0),
                         slack=ALLOCATOR_SLACK if kind == "cpu" else 1.0)
        store_fit(fit)
        res[w] = fit
    return res


# -- the estimate and the guard ---------------------------------------------------------------------------

def _sci(n: float) -> str:
    """``1.2e19 B``-style bytes (two significant digits; plain digits below 10 kB)."""
    if n < 10_000:
        return f"{int(n)} B"
    mant, _, exp = f"{n:.1e}".partition("e")
    return f"{mant}e{int(exp)} B"


def _human(n: float) -> str:
    """``22.1 GB`` (decimal units)."""
    for unit, scale in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class Estimate:
    """A case's memory estimate: ``total`` bytes, ``terms`` (the parenthesis of a refused row's
    message, e.g. ``inputs 2.7e8 B x 3.1, output 2.7e8 B x 14.2, fixed 2.0e8 B: aten's peak on 4
    small cases``), ``source`` (``measured``, ``lower bound``: declared tensors only, or
    ``bound``: :func:`upper_bound`, not measured) and ``note`` (why it is not measured)."""

    total: int
    terms: str
    source: str
    note: str = ""


def _lower(op, case, dtype, flush: int, copies: int) -> Estimate:
    terms = case_memory_terms(op, case, dtype, flush_bytes=flush)
    each = ", ".join(f"{k} {_sci(v)}" for k, v in terms.items()) + "; its tensors alone, a lower bound"
    if copies > 1:
        each += f"; x {copies}: one worker per environment"
    return Estimate(sum(terms.values()) * copies, each, "lower bound")


def _combined(fits, feats: Mapping[str, int], copies: int) -> Estimate:
    """The estimate of a case whose backends have ``fits``: the largest prediction. They share the
    inputs, the reference and the check, and one runs at a time; what each costs a process once
    is in each fit's fixed term, not to be added up (``data/cpu/memory_estimate``: every case
    with all its CPU backends within 0.76-1.17x of the largest backend's estimate)."""
    top = max(fits, key=lambda f: f.predict(feats))
    parts = [f"{ROLE_TERMS[r]} {_sci(feats[r])} x {top.factors[r]:.1f}" for r in ROLES if feats.get(r)]
    n = len(top.points)
    parts.append(f"fixed {_sci(top.fixed)}: {top.backend}'s peak on {n} small case{'s' if n != 1 else ''}")
    text = ", ".join(parts)
    if copies > 1:
        text += f"; x {copies}: one worker per environment"
    return Estimate(int(math.ceil(top.predict(feats))) * copies, text, "measured")


@dataclass
class MemoryCheck:
    """What :func:`memory_check` found for a plan: the ``limit`` (bytes; None: none) and how it
    was read (``said``), the ``refused`` cases (``{(case label, dtype): message}``), the cases
    ``near`` the limit (``{(case label, dtype): Estimate}``, over :data:`NEAR_LIMIT` of it), every
    case's ``estimates`` where one was made, and ``notes`` (fits that could not be measured)."""

    limit: int | None
    said: str
    refused: dict = field(default_factory=dict)
    near: dict = field(default_factory=dict)
    estimates: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def _device_flush_bytes(dev) -> int:
    """The flush buffer the timers allocate on ``dev`` by default: :func:`flush_bytes_for` on a
    GPU (device properties only: no CUDA context is created), none on the CPU (flush off)."""
    if dev.type != "cuda":
        return 0
    try:
        return int(flush_bytes_for(dev))
    except Exception:  # noqa: BLE001 - properties unreadable: the smallest GPU flush
        return MIN_FLUSH_BYTES


def _backend_names(plan: Plan, op: Operator) -> list[str]:
    """The plan's backends as the operator names them (an environment A/B's ``aten@A`` is ``aten``)."""
    names = []
    for b in plan.backends:
        b = b.partition("@")[0]
        if b in op.backends and b not in names:
            names.append(b)
    return names


def estimate_cases(op: Operator, pairs, backends, device, *, measure: bool | Callable = True,
                   copies: int = 1) -> tuple[dict, list[str]]:
    """The measured estimate of each ``(case, dtype)`` of ``pairs``: the largest over
    ``backends`` of their fits' predictions (:class:`Fit`), probes measured where no fit is
    cached (``measure``: True, or a function ``(op, wants, device) -> {(backend, dtype, key): Fit
    or reason}`` in place of :func:`measure_fits`; False: cached fits only). Returns
    ``({(case label, dtype): Estimate}, notes)``; a pair with no fit of any backend is left out
    (a note says why)."""
    import torch

    dev = torch.device(device)
    kind = device_kind(dev)
    probes_of, wants = {}, {}
    for case, dtype in pairs:
        for b in backends:
            pc = probe_cases(op, case, dtype)
            key = fit_key(op, b, dtype, kind, pc)
            probes_of[(case.label, dtype, b)] = key
            if cached_fit(key) is None:
                wants[key] = (b, dtype, tuple(pc))
    fits: dict[str, Fit] = {}
    notes: list[str] = []
    if wants and measure:
        runner = measure if callable(measure) else measure_fits
        for (b, dt, key), got in runner(op, list(wants.values()), dev).items():
            if isinstance(got, Fit):
                fits[key] = got
            elif got not in notes:
                notes.append(f"memory of {op.name} {got}")
    out = {}
    for case, dtype in pairs:
        got = [f for f in (fits.get(probes_of[(case.label, dtype, b)]) or cached_fit(probes_of[(case.label, dtype, b)])
                           for b in backends) if f is not None]
        if got:
            out[(case.label, dtype)] = _combined(got, features(op, case, dtype), copies)
    return out, notes


def memory_check(plan: Plan, device=None, max_memory: int | None = None, *,
                 reader: Callable[[Any], tuple[int | None, str]] | None = None, copies: int = 1,
                 measure: bool | Callable = True) -> MemoryCheck:
    """Check every case of ``plan`` against the memory limit on ``device`` before anything runs.

    The limit is the smaller of ``max_memory`` (bytes, ``--max-memory``) and the device's free
    memory now (``reader(device) -> (bytes or None, source)``, default
    :func:`flyexplore.measure.devstate.free_memory`: MemAvailable on the CPU, NVML on NVIDIA
    without creating a CUDA context, amdsmi or ``torch.cuda.mem_get_info`` on ROCm); where the
    free memory cannot be read, ``max_memory`` alone; with neither, nothing is checked.
    ``device``: a torch device or its text (default: a GPU when one is visible, else the CPU).
    ``copies``: processes that hold a case at once (an environment A/B: one worker per
    environment), each estimate multiplied by it.

    For each case, cheapest first: its lower bound (:func:`case_memory_terms`, with the device's
    flush buffer) over the limit: refused with those terms; its :func:`upper_bound` under
    :data:`NEAR_LIMIT` of the limit: nothing to decide, not measured; else its measured estimate
    (:func:`estimate_cases`; ``measure`` as there) over the limit: refused, e.g. ``estimated memory
    6.3e9 B (inputs 2.7e8 B x 0.0, output 2.7e8 B x 23.4, fixed 5.4e7 B: aten's peak on 4 small
    cases) is over the device's free memory 3.0 GB (MemAvailable, /proc/meminfo)`` (rmsnorm
    8192x8192 fp32, whose peak was 4.94 GB); over
    :data:`NEAR_LIMIT` of it: ``near``. A case that could not be measured is near (not refused:
    its lower bound is under the limit), with a note.

    Raises :class:`UsageError` (one line: the smallest estimate, its case and the limit) when
    every case of the plan is refused, and for a ``max_memory`` that is not an integer >= 1."""
    import torch

    if max_memory is not None and (isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory < 1):
        raise UsageError(f"max_memory must be a number of bytes >= 1, got {max_memory!r}")
    dev = torch.device(device) if device is not None else torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    free, source = (reader or free_memory)(dev)
    limits = []
    if max_memory is not None:
        limits.append((max_memory, f"max_memory (--max-memory) {_human(max_memory)}"))
    if free is not None:
        limits.append((int(free), f"the device's free memory {_human(free)} ({source})"))
    if not limits:
        return MemoryCheck(None, "no limit: the free memory not read, no --max-memory")
    limit, said = min(limits, key=lambda x: x[0])
    check = MemoryCheck(limit, said)
    op, flush, copies = plan.op, _device_flush_bytes(dev), max(int(copies), 1)
    kind = "cpu" if dev.type == "cpu" else "cuda"
    undecided = []
    for case, dtype in plan.pairs:
        if op.memory is not None:  # the family's own estimate (Operator.memory), no probe
            total, terms = op.memory(case, dtype)
            check.estimates[(case.label, dtype)] = Estimate(
                (int(total) + flush) * copies, terms + (f"; x {copies}: one worker per environment" if copies > 1 else ""),
                "family")
            continue
        low = _lower(op, case, dtype, flush, copies)
        if low.total > limit:
            check.estimates[(case.label, dtype)] = low
        elif upper_bound(op, case, dtype, kind) * copies >= NEAR_LIMIT * limit:
            undecided.append((case, dtype))
    if undecided:
        got, notes = estimate_cases(op, undecided, _backend_names(plan, op), dev, measure=measure, copies=copies)
        check.notes.extend(notes)
        for case, dtype in undecided:
            est = got.get((case.label, dtype))
            if est is None:
                b = upper_bound(op, case, dtype, kind) * copies
                est = Estimate(b, f"an upper bound, not measured: {PRIOR_BYTES_PER_ELEMENT} B per declared element "
                                  f"and {_sci(PRIOR_FIXED[kind])} fixed", "bound",
                               notes[0] if notes else "no fit")
            check.estimates[(case.label, dtype)] = est
    for key, est in check.estimates.items():
        if est.total > limit and est.source != "bound":
            check.refused[key] = f"estimated memory {_sci(est.total)} ({est.terms}) is over {said}"
        elif est.total > NEAR_LIMIT * limit:
            check.near[key] = est
    if plan.pairs and len(check.refused) == len(plan.pairs):
        name, est = min(check.estimates.items(), key=lambda kv: kv[1].total)
        raise UsageError(f"every case of the plan is over the memory limit: the smallest, {name[0]} {name[1]}, is "
                         f"estimated at {_sci(est.total)} ({est.terms}), over {said}")
    return check


def memory_refusals(plan: Plan, device=None, max_memory: int | None = None, *,
                    reader: Callable[[Any], tuple[int | None, str]] | None = None, copies: int = 1,
                    measure: bool | Callable = True) -> dict[tuple[str, str], str]:
    """The cases of ``plan`` that must not run on ``device``: ``{(case label, dtype): message}``
    of :func:`memory_check` (the same arguments; its ``refused``)."""
    return memory_check(plan, device, max_memory, reader=reader, copies=copies, measure=measure).refused


# -- the guard of a case near the limit ----------------------------------------------------------------------

#: How often the sweep reads the resident set of a worker running a guarded case, s.
WATCH_S = 0.05


@dataclass(frozen=True)
class Guard:
    """What a case near the limit is held to in its worker (:mod:`flyexplore.run.engine`):
    its ``estimate`` (bytes, ``source`` as :class:`Estimate`'s), the ``limit`` (bytes) and how
    the limit was read (``said``, e.g. ``max_memory (--max-memory) 3.0 GB``). The worker's
    resident set may grow by ``limit`` over the case; past it the worker is killed."""

    estimate: int
    limit: int
    said: str
    source: str = "measured"

    @classmethod
    def of(cls, check: MemoryCheck, key) -> Guard | None:
        """The guard of ``key`` (``(case label, dtype)``) when :func:`memory_check` found it near."""
        est = check.near.get(key)
        return None if est is None or check.limit is None else cls(est.total, check.limit, check.said, est.source)

    def estimated(self) -> str:
        return f"estimated {_human(self.estimate)} ({self.source})"

    def killed_text(self, grown: int) -> str:
        """The message of an ``oom`` row whose worker the sweep killed, its memory ``grown`` bytes."""
        return (f"out of memory: the worker's memory grew {_human(grown)} in this case, past the limit, "
                f"{self.said}; it was killed (SIGKILL) and replaced; {self.estimated()}")



def oom_death_text(rose: int, guard: Guard | None = None) -> str:
    """The message of an ``oom`` row whose worker died of SIGKILL in the case: ``rose``, how much
    the kernel's OOM-kill count (:func:`oom_kills`) rose meanwhile; ``guard``, the case's when it
    was near the limit (its estimate and the limit named)."""
    why = (f"the kernel's OOM killer (oom_kill in /proc/vmstat rose by {rose})" if rose > 0
           else "most likely the kernel's OOM killer")
    text = f"out of memory: the worker was killed by SIGKILL in this case, {why}"
    return text if guard is None else f"{text}; {guard.estimated()}, near the limit, {guard.said}"


def resident_bytes(pid: int) -> int | None:
    """The resident set of process ``pid``, bytes (``VmRSS`` of ``/proc/<pid>/status``), or None
    where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (``oom_kill`` of
    ``/proc/vmstat``, Linux >= 4.13), or None where it cannot be read."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None

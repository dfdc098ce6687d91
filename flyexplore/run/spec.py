"""What a sweep is: :class:`SweepSpec`, one frozen value that the command line (``flyexplore
sweep``), the sweep panel (:class:`flyexplore.ui.panel.SweepPanel`) and Python (``fx.sweep``)
build and :func:`flyexplore.run.sweep.run_sweep` runs.

Every option is checked once, here, when the spec is made -- before any file is opened or
anything runs -- and a bad value is a one-line :class:`~flyexplore.errors.UsageError` naming it
(``flyexplore: error: ...``, exit 2 on the command line). Names are checked against the catalogue
first (no torch), the device last. What the file system says (the output file writable, or there
already without ``resume``/``overwrite``) is :func:`~flyexplore.run.sweep.run_sweep`'s to check when
it opens the file.

The spec travels with its results, the lesson of ``torch.utils.benchmark`` (every ``Measurement``
keeps the ``TaskSpec`` that made it): :meth:`SweepSpec.to_dict` and :meth:`SweepSpec.fingerprint`,
which ``run_sweep`` puts beside the rows (the result frame's ``attrs["sweeps"]``, kept in Parquet
files) without adding a result column.

Also here, because the spec checks them: how a worker finds an operator (:func:`resolve_op`,
:func:`op_ref`), the engine a sweep will use (:func:`choose_engine`, :func:`gpu_indices`) and the
timer options (:data:`TIMER_OPTIONS`). The plan it resolves (:class:`~flyexplore.run.plan.Plan`)
is :mod:`flyexplore.run.plan`'s.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import types
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from flyexplore.errors import UsageError, bad_choice
from flyexplore.measure import modes
from flyexplore.measure.interleaved import CASE_BUDGET_S
from flyexplore.measure.stats import BAND
from flyexplore.ops.base import Case, Operator
from flyexplore.run.plan import Plan, _split, make_plan, op_ref, shapes_file_plan
from flyexplore.run.envs import (MAX_PAIRS, PAIRS, WORKER_CODE, Env, check_envs, extra_paths_for, probe,
                                  thread_refusal)

#: Engines of a sweep (``auto`` picks ``local`` on a GPU, ``in-process`` on the CPU; see
#: :func:`choose_engine` and :mod:`flyexplore.run.engine`).
ENGINES = ("auto", "in-process", "local", "ray")
#: Fractions (the SAME band, the stopping target) lie in (0, FRACTION_MAX): a sanity bound, not a
#: statistical rule (a +-50% band would call 1.5x the same speed).
FRACTION_MAX = 0.5


def _fraction_rule() -> str:
    return f"a fraction in (0, {FRACTION_MAX:g}), e.g. {BAND:g} for ±{BAND:.0%}"


# -- device, seed, engine -------------------------------------------------------------------------

def check_device(dev=None):
    """The ``torch.device`` a sweep will use: ``dev`` (text or device), or ``cuda:0`` when a
    GPU is visible, else ``cpu``. Raises :class:`UsageError` for text torch cannot parse, a
    device type other than cpu/cuda (ROCm GPUs are ``cuda`` in torch), or a GPU that is not
    there (no GPU visible, or an index >= ``torch.cuda.device_count()``)."""
    import torch

    if dev is None:
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(dev)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"bad --device {dev!r} (e.g. cpu, cuda, cuda:1)") from None
    if d.type not in ("cpu", "cuda"):
        raise bad_choice("device type", d.type, ("cpu", "cuda"))
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise UsageError(f"--device {dev!r}: torch sees no CUDA/ROCm GPU here (use cpu)")
        if d.index is not None and d.index >= n:
            raise UsageError(f"--device {dev!r}: torch sees {n} GPU(s) (cuda:0..cuda:{n - 1})")
    return d


def _int_ok(v, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _num_ok(v, positive: bool) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    return v > 0 if positive else v >= 0


def _fraction_ok(v) -> bool:
    return _num_ok(v, True) and v < FRACTION_MAX


def gpu_indices(devices) -> list[int]:
    """Torch GPU indices from ``devices``: ``"all"``, ``"0,1"`` or a list of ints. Raises
    :class:`UsageError` when no GPU is visible or an index is not there."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise UsageError(f"--devices {devices!r}: torch sees no CUDA/ROCm GPU here "
                         "(on the CPU use --workers N for worker processes)")
    if isinstance(devices, str):
        if devices.strip() == "all":
            return list(range(n))
        parts = [p.strip() for p in devices.split(",") if p.strip()]
    else:
        parts = list(devices)
    out = []
    for p in parts:
        try:
            i = int(p)
        except (TypeError, ValueError):
            raise UsageError(f"bad --devices entry {p!r} (use all, or GPU indices such as 0,1)") from None
        if not 0 <= i < n:
            raise UsageError(f"--devices {i}: torch sees {n} GPU(s) (0..{n - 1})")
        if i not in out:
            out.append(i)
    if not out:
        raise UsageError(f"no GPU in --devices {devices!r}")
    return out


def choose_engine(engine: str, device=None, *, devices=None, workers=None, case_timeout=None,
                  max_cases=None, op=None, processes=None) -> str:
    """Check the engine options of a sweep and return the engine it will use: ``in-process``,
    ``local`` or ``ray``. ``auto``: ``local`` when the sweep's device is a GPU or when
    ``devices``, ``workers``, ``case_timeout`` or ``processes`` > 1 are given, else ``in-process`` (see
    :mod:`flyexplore.run.engine` for why). Raises :class:`UsageError` naming the bad value: an
    unknown engine, ``workers`` < 1 or on a GPU, ``devices`` on the CPU or together with
    ``device``, a GPU index torch does not see, a negative ``case_timeout``, ``max_cases`` < 1,
    worker options with ``in-process``, Ray not installed, or an operator a worker cannot import."""

    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r} (valid: {', '.join(ENGINES)})")
    dev = check_device(device)
    if workers is not None and not _int_ok(workers, 1):
        raise UsageError(f"--workers must be an integer >= 1, got {workers!r}")
    if case_timeout is not None and not _num_ok(case_timeout, False):
        raise UsageError(f"--case-timeout must be a number of seconds >= 0 (0 = none), got {case_timeout!r}")
    if max_cases is not None and not _int_ok(max_cases, 1):
        raise UsageError(f"--max-cases-per-worker must be an integer >= 1, got {max_cases!r}")
    if devices is not None:
        if device is not None:
            raise UsageError("give --device or --devices, not both")
        gpu_indices(devices)
    elif workers is not None and dev.type == "cuda" and engine != "ray":
        raise UsageError("--workers is for CPU worker processes; on GPUs use --devices (one worker per GPU)")
    if engine == "in-process":
        for name, v in (("--devices", devices), ("--workers", workers), ("--case-timeout", case_timeout),
                        ("--max-cases-per-worker", max_cases)):
            if v is not None:
                raise UsageError(f"{name} needs worker processes; it does not go with --in-process")
        return "in-process"
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageError("--executor ray needs the ray package: pip install 'flyexplore[ray]'") from None
        kind = "ray"
    elif engine == "local":
        kind = "local"
    else:
        wants = devices is not None or workers is not None or case_timeout is not None or (processes or 1) > 1
        kind = "local" if dev.type == "cuda" or wants else "in-process"
    if kind != "in-process" and op is not None:
        op_ref(op)
    return kind


# -- timer options --------------------------------------------------------------------------------

#: The timer options of a sweep: key -> (the orders that take it, the rule it must follow; None:
#: passed on unchecked). Block order hands them to :class:`flyexplore.measure.timing.Timer` (its
#: keywords); interleaved order translates ``rep``, ``warmup`` and ``rep_ms``
#: (:func:`interleaved_kwargs`) and hands the rest to
#: :func:`flyexplore.measure.interleaved.measure_interleaved`. ``None`` as a value means the
#: timer's default (not for ``min_reps``/``max_reps``).
TIMER_OPTIONS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "mode": (modes.ORDERS, "a timing mode"),
    "rep": (modes.ORDERS, "an integer >= 1"),
    "warmup": (modes.ORDERS, "an integer >= 0"),
    "rep_ms": (modes.ORDERS, "a finite number > 0"),
    "warmup_ms": (modes.ORDERS, "a finite number >= 0"),
    "min_reps": (("block",), "an integer >= 1"),
    "max_reps": (("block",), "an integer >= 1"),
    "flush": (("block",), "true, false or None"),
    "clock": (("block",), None),
    "calls_per_round": (("interleaved",), "an integer >= 1"),
    "min_rounds": (("interleaved",), "an integer >= 1"),
    "max_rounds": (("interleaved",), "an integer >= 1"),
    "target": (("interleaved",), _fraction_rule()),
    "budget_s": (("interleaved",), "a finite number > 0"),
    "precision_cap_s": (("interleaved",), "a finite number > 0"),
    "label_cap_s": (("interleaved",), "a finite number > 0"),
}
_TIMER_CHECKS: dict[str, Callable[[Any], bool]] = {
    "rep": lambda v: _int_ok(v, 1), "warmup": lambda v: _int_ok(v, 0),
    "min_reps": lambda v: _int_ok(v, 1), "max_reps": lambda v: _int_ok(v, 1),
    "rep_ms": lambda v: _num_ok(v, True), "warmup_ms": lambda v: _num_ok(v, False),
    "flush": lambda v: isinstance(v, bool), "calls_per_round": lambda v: _int_ok(v, 1),
    "min_rounds": lambda v: _int_ok(v, 1), "max_rounds": lambda v: _int_ok(v, 1),
    "budget_s": lambda v: _num_ok(v, True), "target": _fraction_ok,
    "precision_cap_s": lambda v: _num_ok(v, True), "label_cap_s": lambda v: _num_ok(v, True),
}
#: The command line's flags for timer options whose flag is not ``--`` + the key.
_FLAGS = {"target": "--ci-target", "budget_s": "--budget-s", "mode": "--timing"}


def timer_keys(order: str) -> tuple[str, ...]:
    """The timer options ``order`` takes (:data:`TIMER_OPTIONS`)."""
    return tuple(k for k, (orders, _) in TIMER_OPTIONS.items() if order in orders)


def _timer_name(key: str, flags: bool) -> str:
    return _FLAGS.get(key, "--" + key.replace("_", "-")) if flags else f"timer option {key}"


def check_timer(timer: Mapping[str, Any] | None, order: str, gpu: bool | None = None, *,
                flags: bool = False) -> dict:
    """Check a sweep's timer options for ``order`` and return them as a new dict: known keys
    (:func:`timer_keys`), each value by its rule (:data:`TIMER_OPTIONS`), ``max_reps >= min_reps``,
    ``max_rounds >= min_rounds``, and ``mode`` by :func:`flyexplore.measure.modes.check` (with
    ``gpu`` given: for that device). ``flags``: name options as the command line's flags
    (``--rep``). Raises :class:`UsageError` naming the bad option and value."""
    if timer is None:
        return {}
    if not isinstance(timer, Mapping):
        raise UsageError(f"timer options must be a dict, got {type(timer).__name__}")
    t = dict(timer)
    known = timer_keys(order)
    for k in t:
        if k not in known:
            if flags and k in ("target", "budget_s"):
                raise UsageError("--ci-target and --budget-s apply to --order interleaved only")
            raise bad_choice("timer option", k, known)
    for k, check in _TIMER_CHECKS.items():
        if k not in t or (t[k] is None and k not in ("min_reps", "max_reps")):
            continue
        if not check(t[k]):
            raise UsageError(f"{_timer_name(k, flags)} must be {TIMER_OPTIONS[k][1]}, got {t[k]!r}")
    for lo, hi in (("min_reps", "max_reps"), ("min_rounds", "max_rounds")):
        if t.get(lo) is not None and t.get(hi) is not None and t[hi] < t[lo]:
            raise UsageError(f"{_timer_name(hi, flags)} ({t[hi]}) is below {_timer_name(lo, flags)} ({t[lo]})")
    modes.check(t.get("mode", modes.DEFAULT), order, gpu)
    return t


def interleaved_kwargs(timer: Mapping[str, Any]) -> dict:
    """A sweep's checked ``timer`` options as the keywords of
    :func:`~flyexplore.measure.interleaved.measure_interleaved`: ``rep`` = a fixed number of
    rounds (no adaptive stopping), ``warmup`` = warm-up rounds, ``rep_ms`` = the case's budget
    in ms; the other interleaved keys pass through."""
    o = {k: v for k, v in timer.items() if k not in ("rep", "warmup", "rep_ms")}
    if timer.get("rep") is not None:
        o["min_rounds"] = o["max_rounds"] = int(timer["rep"])
    if timer.get("warmup") is not None:
        o["warmup_rounds"] = int(timer["warmup"])
    if timer.get("rep_ms") is not None:
        o["budget_s"] = float(timer["rep_ms"]) / 1e3
    return o


# -- the spec -------------------------------------------------------------------------------------

def _json(v):
    """A spec value as JSON: paths and devices as text, tuples as lists, cases by label,
    callables by name."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Case):
        return v.label
    if isinstance(v, Env):
        return v.text()
    if isinstance(v, Mapping):
        return {str(k): _json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json(x) for x in v]
    if callable(v):
        return f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', repr(v))}".lstrip(".")
    return str(v)


#: Fields that say where the rows go, not what is measured: left out of :meth:`SweepSpec.fingerprint`.
FILE_FIELDS = ("out", "resume", "overwrite", "retry_failed", "extend")
#: The most fresh worker processes (``--processes``) or pairs of workers (``--pairs``) a sweep
#: takes without ``force``. Each one is a whole pass of the plan, so 1,000 ran a one-case CPU
#: sweep for about 3.3 hours (issue 33); past 20 the interval barely narrows: its half-width
#: goes as t(n-1)/sqrt(n), and t(19) is within 5% of the normal's 1.96 (scipy.stats.t.ppf).
MAX_PASSES = 20
#: The longest a sweep's time bound (:meth:`SweepSpec.time_bound_s`) may be without ``force``, s.
MAX_SWEEP_S = 24 * 3600.0
#: Seconds a fresh worker takes to start (``import torch``, its runner built) in the time bound:
#: 5-9 s for a pair of A/B workers on the lent H200 (``data/h200/ab/summary.md``), 5-8 s for one
#: CPU worker on the 2-core CI machine (``--processes`` sweeps' progress bars, unloaded); ROCm is
#: taken as CUDA.
WORKER_START_S = {"cpu": 8.0, "cuda": 10.0}
#: A note on the time bound is printed before a sweep past this many seconds
#: (:meth:`SweepSpec.time_note`).
TIME_NOTE_S = 300.0


def _duration(s: float) -> str:
    """``40 s``, ``14 min``, ``2.8 h`` (a time bound, to two figures)."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep is, checked: build it, then ``run_sweep(spec, progress=..., on_row=...,
    should_stop=...)`` (those three are how this run is watched, not what it is).

    What is measured:

    - ``op``: a catalogue name (:func:`flyexplore.ops.list_ops`), ``"module:attribute"`` of an
      Operator, or an :class:`~flyexplore.ops.base.Operator`.
    - ``suite`` or ``shapes`` (exactly one): a named suite, or shape text
      (``"4096x4096x4096;8x4096x4096:NN"``) or a list of shape texts / cases.
    - ``dtypes``, ``backends``: lists or comma text; default the suite's dtypes (with shapes: the
      operator's first) and every backend. Kept as tuples.
    - ``device``: torch device text or ``torch.device`` (default: ``cuda:0`` if a GPU is
      visible, else ``cpu``); ``seed`` (an integer in [0, 2**64)) makes the inputs.
    - ``order``: ``interleaved`` (default) or ``block`` (:data:`flyexplore.measure.modes.ORDERS`);
      ``timer``: the options of that order's timer (:data:`TIMER_OPTIONS`, modes from
      :data:`flyexplore.measure.modes.TABLE`), kept as a read-only mapping.
    - ``band``: the SAME label's equivalence band, a fraction in (0, :data:`FRACTION_MAX`)
      (default :data:`flyexplore.measure.stats.BAND`); ``baseline``: the backend speedups are taken
      against (one of the plan's; default the operator's); ``trace``: record what ran for every
      row.

    Where it runs (:mod:`flyexplore.run.engine`): ``engine`` (:data:`ENGINES`), ``devices``
    (``"all"`` or GPU indices: one worker per GPU), ``workers`` (CPU worker processes, or at
    most this many Ray actors), ``case_timeout`` (s, >= 0, 0 = none; default
    :data:`flyexplore.run.engine.CASE_TIMEOUT_S`), ``max_cases_per_worker`` (>= 1; default
    :data:`flyexplore.run.engine.MAX_CASES`), ``ray_address`` (with ``engine="ray"``).
    ``processes`` (>= 1, default 1): measure every case in this many fresh worker processes, one
    pass of the whole plan each, the case order rotated between passes, and combine each row's
    measurements so that its interval covers another run (:mod:`flyexplore.run.processes`); 2 or
    more needs local workers (interleaved order; not ``in-process`` or Ray) and is part of
    :meth:`plan_dict`; each pass's rows are journaled as they come (a resume runs the passes still
    missing).

    An environment A/B (:mod:`flyexplore.run.envab`): ``envs``, two or more environments
    (:class:`flyexplore.run.envs.Env` or their text, ``"0.14.2b=/opt/envs/b/bin/python"``,
    ``"lt:TORCH_BLAS_PREFER_HIPBLASLT=0"``; :func:`flyexplore.run.envs.parse_env`), or one with
    ``aa=True`` (none: this interpreter) for the A/A floor; each case's arms -- ``backend@env``,
    every backend in every environment, or as ``backends`` names them (``"aten@A,flydsl@B"``) --
    are timed round by round across one worker per environment taking turns on one device.
    ``pairs`` (>= 1, default :data:`flyexplore.run.envs.PAIRS`): fresh pairs of workers, one pass
    of the plan each; ``worker_code``: ``driver`` (the driver's flyexplore source in every
    environment) or ``env`` (each environment's own, same version). ``baseline`` may name an arm;
    a backend is taken in the first environment. The environments are checked (interpreter,
    torch, numpy, flyexplore: :func:`flyexplore.run.envs.probe`) when the spec is made.
    Not with ``order="block"``, ``processes``, ``devices``, ``workers``, the ``in-process`` or
    ``ray`` engine, or the ``kernel`` timing mode.

    Where the rows go: ``out`` (``.parquet``, ``.csv`` or ``.jsonl``; kept as a ``Path``),
    ``resume`` (skip the keys already there) or ``overwrite`` (replace it), not both;
    ``retry_failed`` (with ``resume``: run crashed and timeout rows again); ``extend`` (with
    ``resume``: add this plan's cases to a file made by another plan, which a resume otherwise
    refuses, naming what differs).

    Safety limits (not part of what is measured, nor of :meth:`plan_dict`): ``worker_start_timeout``
    (s, > 0: a worker not ready by then is killed and retried; default
    :data:`flyexplore.run.engine.WORKER_START_TIMEOUT_S`), ``max_memory`` (bytes, >= 1: a case
    whose estimated memory is over it, or over the device's free memory, becomes a ``refused``
    row). ``processes`` and ``pairs`` over :data:`MAX_PASSES`, and a plan whose time bound
    (:meth:`time_bound_s`) is over :data:`MAX_SWEEP_S`, are refused unless ``force``.

    ``flags`` (not kept): name options in messages as the command line's flags (``--rep``, not
    ``timer option rep``). Raises :class:`UsageError` with one line naming the first bad value:
    the order and the plan's names first (the catalogue, no torch), then the other values, then
    the device and the engine (torch, ``torch.cuda.device_count``). After the checks,
    :attr:`plan` is the resolved :class:`Plan` and :attr:`engine_kind` the engine that will run
    (``in-process``, ``local`` or ``ray``).
    """

    op: str | Operator
    suite: str | None = None
    shapes: str | tuple | None = None
    dtypes: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None
    device: str | None = None
    seed: int = 0
    order: str = "interleaved"
    timer: Mapping[str, Any] = field(default_factory=dict)
    band: float = BAND
    baseline: str | None = None
    trace: bool = False
    engine: str = "auto"
    devices: str | tuple[int, ...] | None = None
    workers: int | None = None
    processes: int | None = None
    case_timeout: float | None = None
    max_cases_per_worker: int | None = None
    ray_address: str | None = None
    worker_start_timeout: float | None = None
    max_memory: int | None = None
    envs: tuple | None = None
    pairs: int | str | None = None
    max_pairs: int | None = None
    aa: bool = False
    worker_code: str = "driver"
    out: Path | None = None
    shapes_from: Path | None = None
    resume: bool = False
    overwrite: bool = False
    retry_failed: bool = False
    extend: bool = False
    force: bool = False
    flags: InitVar[bool] = False
    plan: Plan = field(init=False, repr=False, compare=False)
    engine_kind: str = field(init=False, repr=False, compare=False)
    #: an environment A/B's environments, checked (the A/A copy added), and its baseline arm
    environments: tuple = field(init=False, repr=False, compare=False, default=())
    ab_baseline: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self, flags: bool) -> None:
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen: set once, here
        for k in ("dtypes", "backends"):
            v = _split(getattr(self, k))
            put(k, None if v is None else tuple(v))
        if self.shapes is not None and not isinstance(self.shapes, str):
            put("shapes", tuple(self.shapes))
        if isinstance(self.devices, (list, tuple)):
            put("devices", tuple(self.devices))
        if self.envs is not None:
            put("envs", (self.envs,) if isinstance(self.envs, (str, Env)) else tuple(self.envs))
        if self.out is not None:
            if not isinstance(self.out, (str, os.PathLike)):
                raise UsageError(f"out must be a file path, got {type(self.out).__name__}")
            put("out", Path(self.out))
        if self.device is not None and not isinstance(self.device, str):
            put("device", str(self.device))  # a torch.device
        if self.shapes_from is not None:
            if not isinstance(self.shapes_from, (str, os.PathLike)):
                raise UsageError(f"shapes_from must be a file path, got {type(self.shapes_from).__name__}")
            put("shapes_from", Path(self.shapes_from))
        self._check(flags)

    def _check(self, flags: bool) -> None:
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        modes.check_order(self.order)
        for k in ("trace", "resume", "overwrite", "retry_failed", "extend", "aa", "force"):
            v = getattr(self, k)
            if not isinstance(v, bool):
                raise UsageError(f"{'--' + k.replace('_', '-') if flags else k} must be True or False, got {v!r}")
        ab = self.envs is not None or self.aa
        envs = check_envs(self.envs, self.aa) if ab else ()
        put("environments", envs)
        given = self.backends
        if ab and given is not None:   # arms (backend@env) name their backend for the plan's checks
            given = tuple(dict.fromkeys(_arm_parts(a, envs, flags)[0] for a in given))
        if self.shapes_from is not None:
            if self.suite is not None or self.shapes is not None:
                raise UsageError(f"give one of {'--suite, --shapes and --shapes-from' if flags else 'suite, shapes and shapes_from'}")
            plan = shapes_file_plan(self.op, self.shapes_from, self.dtypes, given)
        else:
            plan = make_plan(self.op, self.suite, self.shapes, self.dtypes, given)
        if ab:
            plan = dataclasses.replace(plan, backends=_arms(plan.op, envs, self.backends, flags))
        put("plan", plan)
        timer = check_timer(self.timer, self.order, flags=flags)  # names and rules: no torch yet
        put("timer", types.MappingProxyType(timer))
        if self.resume and self.overwrite:
            raise UsageError("--resume and --overwrite exclude each other (continue the file, or replace it)")
        if self.retry_failed and not self.resume:
            raise UsageError("--retry-failed runs the crashed and timeout rows of a file again: it needs --resume")
        if self.extend and not self.resume:
            raise UsageError("--extend adds this plan's cases to a file being resumed: it needs --resume")
        if self.worker_start_timeout is not None and not _num_ok(self.worker_start_timeout, True):
            raise UsageError(f"{'--worker-start-timeout' if flags else 'worker_start_timeout'} must be a number "
                             f"of seconds > 0, got {self.worker_start_timeout!r}")
        if self.max_memory is not None and not _int_ok(self.max_memory, 1):
            raise UsageError(f"{'--max-memory' if flags else 'max_memory'} must be a number of bytes >= 1, "
                             f"got {self.max_memory!r}")
        if not _fraction_ok(self.band):
            raise UsageError(f"{'--band' if flags else 'band'} must be {_fraction_rule()}, got {self.band!r}")
        if ab:
            put("ab_baseline", _ab_baseline(plan, envs, self.baseline))
        elif self.baseline is not None and self.baseline not in plan.backends:
            raise UsageError(f"baseline {self.baseline!r} is not among the backends ({', '.join(plan.backends)})")
        if not _int_ok(self.seed, 0) or self.seed >= 2 ** 64:
            raise UsageError(f"--seed must be an integer in [0, 2**64), got {self.seed!r}")
        dev = check_device(self.device)
        modes.check(timer.get("mode", modes.DEFAULT), self.order, dev.type == "cuda")
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError("--ray-address needs --executor ray")
        if self.processes is not None and not _int_ok(self.processes, 1):
            raise UsageError(f"{'--processes' if flags else 'processes'} must be an integer >= 1, got {self.processes!r}")
        many = (self.processes or 1) > 1
        if many and self.engine in ("in-process", "ray"):
            raise UsageError(f"{'--processes' if flags else 'processes'} {self.processes} starts fresh local worker "
                             f"processes for each pass; it does not go with "
                             f"{'--in-process' if self.engine == 'in-process' else '--executor ray'}")
        if many and self.order != "interleaved":
            raise UsageError(f"{'--processes' if flags else 'processes'} combines interleaved measurements; "
                             f"it does not go with order {self.order!r}")
        if isinstance(self.pairs, str) and self.pairs.strip().lower() == "auto":
            put("pairs", "auto")
        elif isinstance(self.pairs, str) and self.pairs.strip().isdigit():
            put("pairs", int(self.pairs))
        if self.pairs not in (None, "auto") and not _int_ok(self.pairs, 1):
            raise UsageError(f"{'--pairs' if flags else 'pairs'} must be 'auto' or an integer >= 1, got {self.pairs!r}")
        if self.max_pairs is not None:
            if not _int_ok(self.max_pairs, PAIRS):
                raise UsageError(f"{'--max-pairs' if flags else 'max_pairs'} must be an integer >= {PAIRS} (the pairs "
                                 f"--pairs auto starts with), got {self.max_pairs!r}")
            if self.pairs not in (None, "auto"):
                raise UsageError(f"{'--max-pairs' if flags else 'max_pairs'} caps --pairs auto; with a fixed "
                                 f"{'--pairs' if flags else 'pairs'} {self.pairs} give one or the other")
        for k, v in (("processes", self.processes), ("pairs", None if self.pairs == "auto" else self.pairs),
                     ("max_pairs", self.max_pairs)):
            if v is not None and v > MAX_PASSES and not self.force:
                raise UsageError(f"{'--' + k if flags else k} {v} is over its limit of {MAX_PASSES}: each is a whole "
                                 f"pass of the plan in fresh workers, and past {MAX_PASSES} the interval barely "
                                 f"narrows; give {'--force' if flags else 'force=True'} to run it anyway")
        if self.worker_code not in WORKER_CODE:
            raise UsageError(f"{'--worker-code' if flags else 'worker_code'} must be one of {', '.join(WORKER_CODE)}, "
                             f"got {self.worker_code!r}")
        if not ab:
            for k, v in (("pairs", self.pairs), ("max_pairs", self.max_pairs),
                         ("worker_code", self.worker_code != "driver" or None)):
                if v is not None:
                    raise UsageError(f"{'--' + k.replace('_', '-') if flags else k} is for an environment A/B: give "
                                     f"{'--env' if flags else 'envs'}")
            put("engine_kind", choose_engine(self.engine, self.device, devices=self.devices, workers=self.workers,
                                             case_timeout=self.case_timeout, max_cases=self.max_cases_per_worker,
                                             op=plan.op, processes=self.processes))
        else:
            self._check_ab(dev, timer, flags)
            put("engine_kind", "envab")
        bound = self.time_bound_s()
        if bound > MAX_SWEEP_S and not self.force:
            raise UsageError(f"this sweep could take up to {_duration(bound)} ({self.time_note(terse=True)}), over "
                             f"the limit of {_duration(MAX_SWEEP_S)}; split it, or give "
                             f"{'--force' if flags else 'force=True'} to run it anyway")

    def _check_ab(self, dev, timer: dict, flags: bool) -> None:
        """The options an environment A/B refuses, then each environment's probe (its interpreter
        runs, finds torch, numpy and flyexplore: :func:`flyexplore.run.envs.probe`)."""
        name = (lambda k, f: f if flags else k)  # noqa: E731
        bad = [(name(f"order {self.order!r}", f"--order {self.order}"), self.order != "interleaved"),
               (name("processes", "--processes"), (self.processes or 1) > 1),
               (name("devices", "--devices"), self.devices is not None),
               (name("workers", "--workers"), self.workers is not None),
               (name("max_cases_per_worker", "--max-cases-per-worker"), self.max_cases_per_worker is not None),
               (name("engine", "--in-process / --executor"), self.engine not in ("auto", "local")),
               (name("ray_address", "--ray-address"), self.ray_address is not None)]
        for what, refused in bad:
            if refused:
                extra = {"--processes": " (--pairs starts fresh pairs of workers)",
                         "processes": " (pairs starts fresh pairs of workers)"}.get(what, "")
                raise UsageError(f"an environment A/B runs one worker per environment on one device, its arms timed "
                                 f"round by round: {what} does not go with {name('envs', '--env')}{extra}")
        if timer.get("mode") == "kernel":
            raise UsageError("timing mode 'kernel' would open a profiler session in every turn of an environment A/B; "
                             "use auto (event-gated) or event")
        why = thread_refusal(self.environments, dev.type)   # on the CPU the A/B cannot see a thread count
        if why:
            raise UsageError(why)
        extra = extra_paths_for(op_ref(self.plan.op)) if ":" in op_ref(self.plan.op) else ()
        for e in self.environments:
            probe(e, self.worker_code, extra)

    def to_dict(self) -> dict:
        """Every field as JSON values (paths and devices as text, tuples as lists, cases by
        label, a ``clock`` by its name; an Operator object by :func:`op_ref` where a worker could
        import it, else by name), in field order. ``SweepSpec(**d)`` builds the spec again."""
        out = {}
        for f in fields(self):
            if not f.init:
                continue
            v = getattr(self, f.name)
            if f.name == "op" and isinstance(v, Operator):
                try:
                    v = op_ref(v)
                except UsageError:
                    v = v.name
            out[f.name] = _json(v)
        return out

    def fingerprint(self) -> str:
        """12 hex digits of SHA-256 over :meth:`to_dict` less :data:`FILE_FIELDS` (canonical JSON,
        sorted keys): two specs that measure the same thing, the same way, share it."""
        return digest({k: v for k, v in self.to_dict().items() if k not in (*FILE_FIELDS, "force")})

    def plan_dict(self) -> dict:
        """What the rows of this spec measure and how, as resolved (not as typed): the operator,
        the plan's ``"case dtype"`` entries in order (duplicates folded, a suite or shapes file
        expanded, default options spelled out), its backends, the device it resolves to, and the
        seed, order, timer, band, baseline and trace (and ``processes`` when > 1). JSON values. ``--resume`` must not change it
        silently (:mod:`flyexplore.run.journal`); where the rows go (:data:`FILE_FIELDS`) and
        where and how safely they run (engine, devices, workers, time limits, ``max_memory``) are
        not part of it, so a resume may change them (a longer ``--case-timeout`` after a time-out)."""
        d = self.to_dict()
        ab = ({"envs": [e.to_dict() for e in self.environments],
               "pairs": "auto" if self.pairs_auto else self.pairs_or_default,
               **({"max_pairs": self.pairs_max} if self.pairs_auto else {}),
               "worker_code": self.worker_code, "baseline": self.ab_baseline} if self.environments else {})
        return {"op": self.plan.op.name, "cases": [f"{c.label} {dt}" for c, dt in self.plan.pairs],
                "backends": list(self.plan.backends), "device": str(check_device(self.device)),
                **{k: d[k] for k in ("seed", "order", "timer", "band", "baseline", "trace")},
                **({"processes": self.processes} if (self.processes or 1) > 1 else {}), **ab}

    def time_bound_s(self) -> float:
        """An upper bound on this sweep's timing, s, before it runs: passes (``processes``, or an
        A/B's pairs) x (a worker start, :data:`WORKER_START_S`, when it runs in workers, + the
        plan's cases x each case's budget: the timer's ``budget_s`` (or ``rep_ms``), else
        :data:`flyexplore.measure.interleaved.CASE_BUDGET_S`, the hard limit of an interleaved
        case, all its backends together), the cases divided over the workers. Not counted:
        compiles and autotuning (Inductor's can take minutes a case), and the cases a resume
        skips -- so a bound for the timing, not a promise."""
        passes, start, n, budget, par = self._bound_terms()
        return passes * (start + n * budget / par)

    def time_note(self, terse: bool = False) -> str:
        """What :meth:`time_bound_s` is made of, for the note printed before a sweep whose bound is
        over :data:`TIME_NOTE_S`: ``up to 2.8 h of timing: 1000 passes x (8 s worker start + 1
        case x 2 s budget); compiles not counted`` (``terse``: the part in parentheses' sum alone)."""
        passes, start, n, budget, par = self._bound_terms()
        first = f"{start:g} s worker start + " if start else ""
        per = f" / {par} workers" if par > 1 else ""
        parts = (f"{passes} pass{'es' if passes != 1 else ''} x ({first}{n} case{'s' if n != 1 else ''} x "
                 f"{budget:g} s budget{per})")
        return parts if terse else f"up to {_duration(self.time_bound_s())} of timing: {parts}; compiles not counted"

    def _bound_terms(self) -> tuple[int, float, int, float, int]:
        """(passes, worker start s, cases, budget s a case, workers in parallel) of :meth:`time_bound_s`."""
        gpu = self.plan_device_type() == "cuda"
        budget = float(self.timer.get("budget_s") or CASE_BUDGET_S["cuda" if gpu else "cpu"])
        if self.timer.get("rep_ms"):
            budget = float(self.timer["rep_ms"]) / 1e3
        passes = self.pairs_max if self.environments else (self.processes or 1)
        start = WORKER_START_S["cuda" if gpu else "cpu"] if self.engine_kind != "in-process" else 0.0
        par = 1 if self.environments else max(int(self.workers or 1), len(self.devices or ()) or 1)
        return passes, start, len(self.plan.pairs), budget, par

    def plan_device_type(self) -> str:
        """``cuda`` (CUDA or ROCm) or ``cpu``: where this spec's cases run, from ``device`` (no
        torch call when it is given)."""
        if self.device is not None:
            return "cuda" if str(self.device).startswith("cuda") else "cpu"
        return check_device(None).type

    @property
    def pairs_auto(self) -> bool:
        """Whether an environment A/B adds pairs until its labels are decided (``pairs`` None or
        ``"auto"``, the default) rather than running a fixed number."""
        return self.pairs in (None, "auto")

    @property
    def pairs_or_default(self) -> int:
        """The fresh pairs of workers an environment A/B runs at least: a fixed ``pairs``, else
        (``auto``) the :data:`flyexplore.run.envs.PAIRS` it starts with."""
        return PAIRS if self.pairs_auto else int(self.pairs)

    @property
    def pairs_max(self) -> int:
        """The most pairs an environment A/B runs: a fixed ``pairs``, else ``max_pairs`` or
        :data:`flyexplore.run.envs.MAX_PAIRS`."""
        return (self.max_pairs or MAX_PAIRS) if self.pairs_auto else int(self.pairs)

    def plan_fingerprint(self) -> str:
        """12 hex digits of SHA-256 over :meth:`plan_dict`: the plan a sweep's journal keeps
        (:mod:`flyexplore.run.journal`); a resume with another one is refused unless ``extend``."""
        return digest(self.plan_dict())


def _arm_parts(text, envs, flags: bool) -> tuple[str, str | None]:
    """``(backend, env name or None)`` of an entry of an A/B's ``backends`` (``aten@A`` or
    ``aten``); an environment that is not one of ``envs`` is a :class:`UsageError`."""
    b, sep, e = str(text).strip().partition("@")
    if sep:
        names = [x.name for x in envs]
        if e not in names:
            raise UsageError(f"{'--backends' if flags else 'backends'} entry {text!r}: no environment {e!r} "
                             f"(environments: {', '.join(names)})")
        return b.strip(), e
    return b.strip(), None


def _arms(op: Operator, envs, backends, flags: bool = False) -> tuple[str, ...]:
    """An environment A/B's arms, ``backend@env``, in environment order: each backend of
    ``backends`` (default: all of the operator's) in every environment, or in the one its
    ``@env`` names. Raises :class:`UsageError` for an environment left without a backend."""
    items = _split(backends) or list(op.backends)
    per: dict[str, list[str]] = {e.name: [] for e in envs}
    for t in items:
        b, e = _arm_parts(t, envs, flags)
        op.get_backend(b)
        for name in ([e] if e else list(per)):
            if b not in per[name]:
                per[name].append(b)
    empty = [n for n, bs in per.items() if not bs]
    if empty:
        raise UsageError(f"environment {empty[0]!r} has no backend to time (name one as backend@{empty[0]})")
    return tuple(f"{b}@{n}" for n, bs in per.items() for b in bs)


def _ab_baseline(plan: Plan, envs, baseline) -> str:
    """The arm an environment A/B's speedups are taken against: ``baseline`` (an arm, or a
    backend of the first environment), else the operator's baseline backend in the first
    environment, else its first arm. Raises :class:`UsageError` for a baseline that is no arm."""
    first = envs[0].name
    if baseline is not None:
        a = baseline if "@" in str(baseline) else f"{baseline}@{first}"
        if a not in plan.backends:
            raise UsageError(f"baseline {baseline!r} is not an arm of the A/B ({', '.join(plan.backends)})")
        return a
    mine = [a for a in plan.backends if a.endswith(f"@{first}")]
    base = next((f"{b}@{first}" for b, bk in plan.op.backends.items() if bk.baseline and f"{b}@{first}" in mine), None)
    return base or mine[0]


def digest(d: dict) -> str:
    """12 hex digits of SHA-256 over ``d`` as canonical JSON (sorted keys): the fingerprints of
    :class:`SweepSpec`."""
    text = json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]

"""Checks of sweep options, made before any file is opened: a bad value is a
:class:`~flyexplore.errors.UsageError` naming it (``flyexplore: error: ...``, exit 2), never a
sweep whose every row is an ``error`` written over an existing result file.

Used by ``flyexplore sweep`` (:mod:`flyexplore.cli`, with the command line's option names) and
at the start of :func:`flyexplore.run.sweep.run_sweep`.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Mapping

from flyexplore.errors import UsageError, bad_choice
from flyexplore.measure.interleaved import INTERLEAVED_MODES
from flyexplore.measure.timing import CPU_MODES, MODES, Timer

#: Timer options checked here and the rule each must follow (others that
#: :class:`flyexplore.measure.timing.Timer` accepts pass through unchecked).
RULES = {"rep": "an integer >= 1", "warmup": "an integer >= 0", "min_reps": "an integer >= 1",
         "max_reps": "an integer >= 1", "rep_ms": "a finite number > 0",
         "warmup_ms": "a finite number >= 0", "flush": "true, false or None",
         "calls_per_round": "an integer >= 1", "min_rounds": "an integer >= 1",
         "max_rounds": "an integer >= 1", "budget_s": "a finite number > 0",
         "target": "a fraction in (0, 0.5), e.g. 0.01 for +-1%"}
#: Timer options of an interleaved sweep (:func:`flyexplore.run.sweep.measure_case`): ``rep`` is a
#: fixed number of rounds, ``warmup`` warm-up rounds, ``rep_ms`` the case budget in ms; the
#: others are :func:`flyexplore.measure.interleaved.measure_interleaved`'s.
INTERLEAVED_KEYS = ("mode", "rep", "warmup", "rep_ms", "calls_per_round", "min_rounds",
                    "max_rounds", "target", "budget_s", "warmup_ms")


def _name(key: str, cli: bool) -> str:
    return "--" + key.replace("_", "-") if cli else f"timer option {key}"


def _int_ok(v, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _num_ok(v, positive: bool) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    return v > 0 if positive else v >= 0


def device(dev=None):
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


def seed(value) -> int:
    """``value`` if it is an integer in [0, 2**64) (``torch.Generator.manual_seed``'s range);
    else :class:`UsageError`."""
    if not _int_ok(value, 0) or value >= 2 ** 64:
        raise UsageError(f"--seed must be an integer in [0, 2**64), got {value!r}")
    return value


def timer_options(timer: Mapping[str, Any] | None, dev=None, *, cli: bool = False,
                  order: str = "interleaved") -> dict:
    """Check the options a sweep passes to its timer and return them as a new dict.
    ``order="interleaved"`` (the sweep's default): the keys of :data:`INTERLEAVED_KEYS` and
    ``mode`` one of ``flyexplore.measure.interleaved.INTERLEAVED_MODES``; ``order="block"``: the keywords
    of :class:`flyexplore.measure.timing.Timer` and ``mode`` one of ``flyexplore.measure.timing.MODES``.
    Rules: :data:`RULES`; on the CPU (``dev``) only ``auto``, ``cpu-thread`` or ``cpu-wall``
    (both refused on a GPU); ``max_reps >= min_reps``, ``max_rounds >= min_rounds``. ``cli``
    names the options as ``--rep`` etc. Raises :class:`UsageError` naming the bad option and
    value."""

    if timer is None:
        return {}
    if not isinstance(timer, Mapping):
        raise UsageError(f"timer options must be a dict, got {type(timer).__name__}")
    t = dict(timer)
    if order == "interleaved":
        known = list(INTERLEAVED_KEYS)
    else:
        known = [p for p in inspect.signature(Timer.__init__).parameters if p not in ("self", "fn", "device")]
    for k in t:
        if k not in known:
            raise bad_choice("timer option", k, known)
    for k, rule in RULES.items():
        if k not in t or (t[k] is None and k not in ("min_reps", "max_reps")):
            continue
        v = t[k]
        ok = {"rep": lambda: _int_ok(v, 1), "warmup": lambda: _int_ok(v, 0),
              "min_reps": lambda: _int_ok(v, 1), "max_reps": lambda: _int_ok(v, 1),
              "rep_ms": lambda: _num_ok(v, True), "warmup_ms": lambda: _num_ok(v, False),
              "flush": lambda: isinstance(v, bool), "calls_per_round": lambda: _int_ok(v, 1),
              "min_rounds": lambda: _int_ok(v, 1), "max_rounds": lambda: _int_ok(v, 1),
              "budget_s": lambda: _num_ok(v, True),
              "target": lambda: _num_ok(v, True) and v < 0.5}[k]()
        if not ok:
            raise UsageError(f"{_name(k, cli)} must be {rule}, got {v!r}")
    if t.get("max_reps", 1000) < t.get("min_reps", 1):
        raise UsageError(f"{_name('max_reps', cli)} ({t.get('max_reps', 1000)}) is below "
                         f"{_name('min_reps', cli)} ({t.get('min_reps', 5)})")
    if t.get("max_rounds", 2000) < t.get("min_rounds", 1):
        raise UsageError(f"{_name('max_rounds', cli)} ({t.get('max_rounds')}) is below "
                         f"{_name('min_rounds', cli)} ({t.get('min_rounds')})")
    mode = t.get("mode", "auto")
    modes = INTERLEAVED_MODES if order == "interleaved" else MODES
    if mode not in modes:
        raise bad_choice("timing mode", mode, modes)
    if dev is not None:
        d = device(dev)
        if d.type == "cpu" and mode not in CPU_MODES:
            raise UsageError(f"timing mode {mode!r} needs a GPU; on the CPU use auto, cpu-thread or cpu-wall")
        if d.type == "cuda" and mode in ("cpu-wall", "cpu-thread"):
            raise UsageError(f"timing mode {mode!r} is for the CPU; on a GPU use auto or "
                             + ", ".join(m for m in modes if m not in CPU_MODES))
    return t


def sweep_options(timer: Mapping[str, Any] | None = None, dev=None, seed_value: int = 0, *,
                  cli: bool = False, order: str = "interleaved") -> dict:
    """Check a sweep's timer options (for its ``order``), device and seed together
    (:func:`timer_options`, :func:`device`, :func:`seed`); returns the timer options. Raises
    :class:`UsageError`."""
    device(dev)
    seed(seed_value)
    return timer_options(timer, dev if dev is not None else device(None), cli=cli, order=order)

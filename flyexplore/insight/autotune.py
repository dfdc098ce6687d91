"""Inductor autotune decisions: every candidate benchmarked, its time, the winner.

:func:`capture_autotune` records each Inductor autotune decision through
``torch._inductor.select_algorithm.add_feedback_saver`` (present in torch 2.11 and 2.15, both
passing six arguments; only the first two -- timings, op name -- are read), falling back to
parsing the ``AUTOTUNE`` table Inductor prints to stderr where the hook does not exist. Both
paths were run on the CPU (bmm max-autotune, ATen vs Inductor's C++ template) with torch 2.11
and 2.15. "FlyDSL enabled but Triton won" is then visible: :attr:`AutotuneDecision.winner_family`.

Split from :mod:`flyexplore.insight.trace`, which re-exports every name here.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
import sys
from dataclasses import dataclass
from typing import Iterator

_CHOICE_CLASSES = {
    "FlyDSLTemplateCaller": ("FlyDSL", "FlyDSL template"),
    "TritonTemplateCaller": ("Triton/Inductor", "Triton template"),
    "ExternKernelCaller": ("ATen", "ATen extern kernel (vendor BLAS on GPU)"),
    "CUTLASSTemplateCaller": ("CUTLASS", "CUTLASS template"),
    "CUDATemplateCaller": ("CUTLASS", "CUTLASS template"),
    "ROCmTemplateCaller": ("CK", "CK template"),
    "CuteDSLTemplateCaller": ("CuTeDSL", "CuTeDSL template"),
    "SubgraphChoiceCaller": ("Triton/Inductor", "Inductor subgraph (e.g. decompose_k)"),
}
#: Autotune candidate families.
CHOICE_FAMILIES = ("FlyDSL", "Triton/Inductor", "ATen", "C++ template", "CUTLASS", "CK", "CuTeDSL", "unclassified")


def classify_choice(name: str, class_name: str = "") -> tuple[str, str]:
    """(family, library) of an Inductor autotune candidate, from its ChoiceCaller class
    (``FlyDSLTemplateCaller``, ``TritonTemplateCaller``, ``ExternKernelCaller``, ...) or,
    failing that, its name (``flydsl_*`` FlyDSL, ``triton_*`` Triton, ``cpp_*`` Inductor's
    C++ CPU template, the aten op name for ATen)."""
    if class_name in _CHOICE_CLASSES:
        return _CHOICE_CLASSES[class_name]
    if name.startswith("flydsl_"):
        return "FlyDSL", "FlyDSL template"
    if name.startswith("triton_"):
        return "Triton/Inductor", "Triton template"
    if name.startswith("cpp_"):
        return "C++ template", "Inductor C++ GEMM template (CPU)"
    if re.fullmatch(r"_?(mm|addmm|bmm|baddbmm|_?scaled_mm(_v2)?|_?fp8_mm(_v2)?|_?grouped_mm|_int_mm)", name):
        return "ATen", "ATen extern kernel"
    return "unclassified", ""


@dataclass(frozen=True)
class Candidate:
    """One autotune candidate: ``time_ms`` as Inductor benchmarked it (``inf`` = failed)."""

    name: str
    family: str
    time_ms: float
    description: str = ""


@dataclass(frozen=True)
class AutotuneDecision:
    """One Inductor autotune: the op (``mm``, ``grouped_mm``, ``scaled_mm``, ...), every
    candidate sorted by time, and where the data came from (``feedback_saver`` or ``stderr``)."""

    op: str
    candidates: tuple[Candidate, ...]
    source: str

    @property
    def winner(self) -> Candidate | None:
        ok = [c for c in self.candidates if math.isfinite(c.time_ms)]
        return min(ok, key=lambda c: c.time_ms) if ok else None

    @property
    def winner_family(self) -> str | None:
        w = self.winner
        return w.family if w else None

    def best_of(self, family: str) -> Candidate | None:
        cs = [c for c in self.candidates if c.family == family and math.isfinite(c.time_ms)]
        return min(cs, key=lambda c: c.time_ms) if cs else None

    def summary(self) -> str:
        """``"mm: 12 candidates, winner triton_mm_3 (Triton/Inductor) 0.190 ms; best FlyDSL
        flydsl_mm_flydsl_0 0.201 ms (1.06x slower)"``."""
        w = self.winner
        if w is None:
            return f"{self.op}: {len(self.candidates)} candidates, none succeeded"
        s = f"{self.op}: {len(self.candidates)} candidates, winner {w.name} ({w.family}) {w.time_ms:.4g} ms"
        if w.family != "FlyDSL":
            f = self.best_of("FlyDSL")
            if f is not None:
                s += f"; best FlyDSL {f.name} {f.time_ms:.4g} ms ({f.time_ms / w.time_ms:.2f}x slower)"
            elif any(c.family == "FlyDSL" for c in self.candidates):
                s += "; every FlyDSL candidate failed"
        return s


def decision_from_timings(name: str, timings: dict, source: str = "feedback_saver") -> AutotuneDecision:
    """An :class:`AutotuneDecision` from Inductor's ``{ChoiceCaller: ms}`` timings."""
    cands = []
    for choice, t in timings.items():
        cname = str(getattr(choice, "name", choice))
        fam, _ = classify_choice(cname, type(choice).__name__)
        try:
            tm = float(t)
        except (TypeError, ValueError):
            tm = math.inf
        cands.append(Candidate(cname, fam, tm if not math.isnan(tm) else math.inf,
                               str(getattr(choice, "description", "") or "")[:300]))
    cands.sort(key=lambda c: c.time_ms)
    return AutotuneDecision(str(name), tuple(cands), source)


_TABLE_HEAD = re.compile(r"^AUTOTUNE (\w+)\(")
_TABLE_ROW = re.compile(r"^\s+(\S+)\s+([0-9.]+|inf|nan)\s+ms\s+([0-9.]+)%\s*(.*)$")


def parse_autotune_tables(text: str) -> list[AutotuneDecision]:
    """Decisions from the ``AUTOTUNE op(...)`` tables Inductor prints to stderr (header line,
    ``strides:``/``dtypes:`` lines, then ``  name time ms pct% description`` rows, fastest
    first). Families come from the candidate names only (:func:`classify_choice`)."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _TABLE_HEAD.match(lines[i])
        i += 1
        if not m:
            continue
        while i < len(lines) and re.match(r"^(strides|dtypes|layout|shape)s?:", lines[i]):
            i += 1
        cands = []
        while i < len(lines):
            r = _TABLE_ROW.match(lines[i])
            if not r:
                break
            fam, _ = classify_choice(r.group(1))
            t = float(r.group(2)) if r.group(2) not in ("inf", "nan") else math.inf
            cands.append(Candidate(r.group(1), fam, t, r.group(4).strip()))
            i += 1
        if cands:
            out.append(AutotuneDecision(m.group(1), tuple(sorted(cands, key=lambda c: c.time_ms)), "stderr"))
    return out


class _Tee(io.TextIOBase):
    def __init__(self, a, b):
        self.a, self.b = a, b

    def write(self, s):
        self.b.write(s)
        return self.a.write(s)

    def flush(self):
        self.a.flush()


def _selector_cache(sa):
    getter = getattr(sa, "get_algorithm_selector_cache", None)
    if getter is not None:
        try:
            return getter()
        except Exception:
            return None
    return getattr(sa, "_ALGORITHM_SELECTOR_CACHE", None)


@contextlib.contextmanager
def capture_autotune() -> Iterator[list[AutotuneDecision]]:
    """Context manager collecting the Inductor autotune decisions made inside it (a list,
    filled as they happen). Uses ``select_algorithm.add_feedback_saver`` where it exists and
    removes only its own hook on exit; otherwise tees stderr and parses the AUTOTUNE tables.
    A cached autotune result is reported too (torch calls the hook after the cache lookup);
    a single-candidate op is not autotuned, and a graph served whole from Inductor's FX graph
    cache is not lowered at all: neither produces a decision (Inductor options
    ``fx_graph_cache=False, autotune_local_cache=False`` make every compile lower and autotune anew)."""
    out: list[AutotuneDecision] = []
    try:
        from torch._inductor import select_algorithm as sa
    except Exception:
        yield out
        return

    def hook(*args):
        try:
            out.append(decision_from_timings(args[1] if len(args) > 1 else "?", args[0]))
        except Exception as exc:  # never break a compile
            out.append(AutotuneDecision(f"? ({type(exc).__name__})", (), "feedback_saver"))

    if hasattr(sa, "add_feedback_saver"):
        sa.add_feedback_saver(hook)
        try:
            yield out
        finally:
            cache = _selector_cache(sa)
            fns = getattr(cache, "feedback_saver_fns", None)
            if fns is not None and hook in fns:
                fns.remove(hook)
        return
    buf = io.StringIO()
    old = sys.stderr
    sys.stderr = _Tee(old, buf)
    try:
        yield out
    finally:
        sys.stderr = old
        out.extend(parse_autotune_tables(buf.getvalue()))


def autotune_dict(d: AutotuneDecision) -> dict:
    """One decision as JSON-ready data (the ``autotune`` result column): ``op``, ``source``,
    ``winner``, ``winner_family`` and ``candidates`` (name, family, ``time_ms`` -- ``None``
    for a failed candidate -- and description)."""
    w = d.winner
    return {"op": d.op, "source": d.source, "winner": w.name if w else None,
            "winner_family": w.family if w else None,
            "candidates": [{"name": c.name, "family": c.family,
                            "time_ms": c.time_ms if math.isfinite(c.time_ms) else None,
                            "description": c.description} for c in d.candidates]}

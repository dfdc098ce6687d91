"""What really ran: :func:`trace` runs a callable under ``torch.profiler`` and returns a
:class:`Trace` -- every device kernel the call launched (launches and device µs per call),
classified into a family by :func:`flyexplore.insight.kernels.classify`, and the Inductor
autotune decisions (:mod:`flyexplore.insight.autotune`), so "FlyDSL enabled but Triton won" is
visible (:attr:`~flyexplore.insight.autotune.AutotuneDecision.winner_family`). On a CPU there are
no device kernels: the trace lists the top-level CPU operators of the call instead and says so.

Sweeps reuse the kernel list :class:`~flyexplore.measure.timing.Timer` already collects in
``kernel`` mode (:func:`from_kernels`) and profile one extra call only when it has none. One
catalogue case traced, and the columns a sweep row gets from a trace, are
:mod:`flyexplore.insight.case_trace`.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

from flyexplore.insight.autotune import AutotuneDecision, autotune_dict, capture_autotune
from flyexplore.insight.kernels import classify, classify_cpu_op
from flyexplore.measure.timing import kernel_times_from_profile


@dataclass(frozen=True)
class TracedKernel:
    """One kernel (``where="device"``) or top-level CPU operator (``where="cpu"``): launches
    per call and time per call in µs (device time for kernels, CPU time for CPU ops)."""

    name: str
    family: str
    library: str
    calls: float
    us: float
    where: str = "device"
    backend: str = ""

    @property
    def label(self) -> str:
        """``AOTriton[<backend>]`` for an AOTriton kernel, else the family (see :class:`KernelClass`)."""
        return f"{self.family}[{self.backend}]" if self.backend else self.family


# -- traces --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trace:
    """What one call ran. ``kernels``: device kernels (empty on CPU); ``cpu_ops``: top-level
    CPU operators (filled when there are no device kernels); ``autotune``: the decisions
    captured while the call was first run (compiled); ``device``: ``"cuda"`` or ``"cpu"``."""

    kernels: tuple[TracedKernel, ...]
    cpu_ops: tuple[TracedKernel, ...] = ()
    autotune: tuple[AutotuneDecision, ...] = ()
    device: str = "cuda"
    notes: tuple[str, ...] = ()

    @property
    def items(self) -> tuple[TracedKernel, ...]:
        return self.kernels if self.kernels else self.cpu_ops

    @property
    def families(self) -> tuple[str, ...]:
        """Families seen, by time spent (device kernels if any, else CPU ops)."""
        tot: dict[str, float] = {}
        for k in self.items:
            tot[k.family] = tot.get(k.family, 0.0) + k.us
        return tuple(sorted(tot, key=lambda f: -tot[f]))

    @property
    def observed(self) -> str:
        """Comma-separated families by time (the ``observed`` result column), AOTriton split by
        backend (``AOTriton[FlyDSL],AOTriton[Triton]``); CPU traces say so."""
        if not self.items:
            return "no kernels recorded"
        tot: dict[str, float] = {}
        for k in self.items:
            tot[k.label] = tot.get(k.label, 0.0) + k.us
        fams = ",".join(sorted(tot, key=lambda f: -tot[f]))
        return fams if self.kernels else f"CPU: {fams}"

    @property
    def aotriton_backends(self) -> tuple[str, ...]:
        """AOTriton's backends whose kernels ran (``Triton``, ``aiter``, ``FlyDSL``), by time."""
        tot: dict[str, float] = {}
        for k in self.kernels:
            if k.family == "AOTriton" and k.backend:
                tot[k.backend] = tot.get(k.backend, 0.0) + k.us
        return tuple(sorted(tot, key=lambda b: -tot[b]))

    @property
    def flydsl_taken(self) -> bool | None:
        """True when a FlyDSL kernel ran (AOTriton's FlyDSL "flyc" kernels included); False when
        every device kernel seen is classified and none is FlyDSL, or the call ran on the CPU
        (FlyDSL is GPU-only); None (unknown) when a GPU call left no kernel record or some kernel
        is unclassified."""
        if self.kernels:
            if any(k.family == "FlyDSL" or k.backend == "FlyDSL" for k in self.kernels):
                return True
            return None if any(k.family == "unclassified" for k in self.kernels) else False
        return False if self.device == "cpu" else None

    @property
    def unclassified(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.items if k.family == "unclassified")

    def to_frame(self):
        """One row per kernel / CPU op: name, family, library, calls, us, where."""
        import pandas as pd

        return pd.DataFrame([asdict(k) for k in self.items],
                            columns=["name", "family", "library", "calls", "us", "where"])

    def family_frame(self):
        """One row per family, by time: ``family``, ``kernels`` (distinct names), ``calls``
        (launches per call), ``us`` (µs per call) and ``share`` (of the traced time, 0..1).
        Device kernels if any, else the CPU operators (``where`` says which)."""
        import pandas as pd

        cols = ["family", "kernels", "calls", "us", "share", "where"]
        items = self.items
        if not items:
            return pd.DataFrame(columns=cols)
        total = sum(k.us for k in items)
        rows = []
        for fam in self.families:
            ks = [k for k in items if k.family == fam]
            us = sum(k.us for k in ks)
            rows.append({"family": fam, "kernels": len({k.name for k in ks}), "calls": sum(k.calls for k in ks),
                         "us": us, "share": us / total if total > 0 else float("nan"), "where": ks[0].where})
        return pd.DataFrame(rows, columns=cols)

    def autotune_frame(self):
        """Every autotune candidate seen: ``op``, ``name``, ``family``, ``time_ms`` (``inf``: it
        failed), ``winner`` (bool), ``source`` (``feedback_saver`` or ``stderr``); fastest first
        within each decision."""
        import pandas as pd

        rows = []
        for d in self.autotune:
            w = d.winner
            for c in d.candidates:
                rows.append({"op": d.op, "name": c.name, "family": c.family, "time_ms": c.time_ms,
                             "winner": w is not None and c.name == w.name, "source": d.source})
        return pd.DataFrame(rows, columns=["op", "name", "family", "time_ms", "winner", "source"])

    def to_dict(self) -> dict:
        return {"device": self.device, "observed": self.observed, "flydsl_taken": self.flydsl_taken,
                "kernels": [asdict(k) for k in self.kernels], "cpu_ops": [asdict(k) for k in self.cpu_ops],
                "autotune": [autotune_dict(d) for d in self.autotune], "notes": list(self.notes)}

    def to_text(self) -> str:
        lines = [f"observed: {self.observed}"]
        if not self.kernels:
            lines.append("no device kernels" + (" (CPU run: top-level CPU operators below)" if self.device == "cpu" else ""))
        for k in self.items:
            lines.append(f"  {k.us:10.2f} us  x{k.calls:g}  {k.family:16s} {k.library:34s} {k.name[:110]}")
        for d in self.autotune:
            lines.append("autotune " + d.summary())
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


def from_kernels(kernels: Iterable, autotune: Sequence[AutotuneDecision] = (), device: str = "cuda") -> Trace:
    """A :class:`Trace` from :class:`~flyexplore.measure.timing.KernelTime` objects or the
    ``kernels`` JSON column (``[[name, launches per call, us per call], ...]``)."""
    if isinstance(kernels, str):
        kernels = json.loads(kernels) if kernels.strip() else []
    out = []
    for k in kernels:
        name, calls, us = (k.name, k.calls_per_iter, k.us_per_iter) if hasattr(k, "name") else (k[0], k[1], k[2])
        c = classify(name)
        out.append(TracedKernel(name, c.family, c.library, float(calls), float(us), backend=c.backend))
    return Trace(tuple(out), (), tuple(autotune), device)


_LABEL = "flyexplore::trace"


def _cpu_ops(prof, reps: int, label: str) -> tuple[TracedKernel, ...]:
    agg: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.name != label:
            continue
        for child in evt.cpu_children:
            agg.setdefault(child.name, []).append(float(child.cpu_time_total))
    out = []
    for name, ts in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
        c = classify_cpu_op(name)
        out.append(TracedKernel(name, c.family, c.library, len(ts) / reps, sum(ts) / reps, "cpu"))
    return tuple(out)


def trace(fn: Callable[[], Any], *, device=None, reps: int = 3, warmup: int = 1,
          autotune: bool = True) -> Trace:
    """Run ``fn`` ``warmup`` times (the first call compiles and autotunes a compiled
    callable; decisions are captured when ``autotune``), then ``reps`` times under
    ``torch.profiler``, and classify what ran. ``device``: where ``fn`` runs (default: the
    current CUDA/ROCm device if there is one, else the CPU). Times are per call (µs)."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile


    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = dev.type == "cuda"
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    cap = capture_autotune() if autotune else contextlib.nullcontext([])
    with cap as decisions:
        for _ in range(warmup):
            fn()
        if gpu:
            torch.cuda.synchronize(dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            with record_function(_LABEL):
                fn()
        if gpu:
            torch.cuda.synchronize(dev)
    notes = []
    kernels: tuple[TracedKernel, ...] = ()
    if gpu:
        _, kts = kernel_times_from_profile(prof, reps, _LABEL)
        kernels = from_kernels(kts).kernels
        if not kernels:
            notes.append("the profiler recorded no device kernel for the call")
    cpu = () if kernels else _cpu_ops(prof, reps, _LABEL)
    if not gpu:
        notes.append("CPU run: no device kernels exist; listed are the call's top-level CPU operators")
    if autotune and not decisions:
        notes.append("no autotune decision captured (eager call, a single candidate, compiled before tracing, "
                     "or a graph served from Inductor's FX graph cache: set "
                     "fx_graph_cache=False and autotune_local_cache=False to see the decision)")
    return Trace(kernels, cpu, tuple(decisions), "cuda" if gpu else "cpu", tuple(notes))

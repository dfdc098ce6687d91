"""The timing modes, one table (:data:`TABLE`): each mode's name, the device it runs on, the
timers that take it, and what it measures, in one line.

Two timers, named by the sweep order that uses them (:data:`ORDERS`, a row's ``order`` column):
``interleaved`` is :func:`flyexplore.measure.interleaved.measure_interleaved` (every backend of a
case timed round by round) and ``block`` is :class:`flyexplore.measure.timing.Timer` (one
callable's calls in one block). ``auto`` is not the same mode in both: :data:`AUTO` says what it
becomes. :func:`check` is the one check of a mode against a timer and a device; both timers,
:class:`flyexplore.run.spec.SweepSpec` and the command line (``flyexplore sweep --help`` lists
:func:`listing`) read this table. It imports no numpy and no torch, so ``--help`` stays light.
"""
from __future__ import annotations

from dataclasses import dataclass

from flyexplore.errors import UsageError, bad_choice

#: The sweep orders, each with its timer: ``interleaved`` (the default, ``measure_interleaved``)
#: and ``block`` (``Timer``).
ORDERS = ("interleaved", "block")
#: The mode a timer uses when none is asked for.
DEFAULT = "auto"
#: What ``auto`` becomes, per order, on the CPU and on a GPU. Block order's ``kernel`` falls back
#: to ``graph``, then ``event``, when the profiler gives no device time (with a note saying so);
#: on the CPU ``cpu-thread`` becomes ``cpu-wall`` when a custom clock is given (:func:`effective`).
AUTO = {"interleaved": {"cpu": "cpu-thread", "gpu": "event-gated"},
        "block": {"cpu": "cpu-thread", "gpu": "kernel"}}


@dataclass(frozen=True)
class Mode:
    """One row of :data:`TABLE`: ``name``; ``device``: ``"cpu"``, ``"gpu"`` or ``"any"``;
    ``orders``: the orders (timers) that take it; ``meaning``: what it measures, one line."""

    name: str
    device: str
    orders: tuple[str, ...]
    meaning: str


#: Every timing mode, in the order the help lists them (each order's modes keep this order).
TABLE = (
    Mode("auto", "any", ORDERS,
         "the default: cpu-thread on the CPU; on a GPU event-gated (interleaved) or kernel (block; graph, "
         "then event, where the profiler gives no device time)"),
    Mode("cpu-thread", "cpu", ORDERS,
         "time.thread_time around each call: this thread's CPU time, so time slices lost to other "
         "processes do not count"),
    Mode("cpu-wall", "cpu", ORDERS, "time.perf_counter around each call (what a custom clock gives too)"),
    Mode("event-gated", "gpu", ("interleaved",),
         "an event pair around each call while a spin kernel holds the stream as the host enqueues "
         "the round: device time without launch gaps"),
    Mode("event", "gpu", ORDERS,
         "an event pair around each call, the cache flushed before it (as triton's do_bench); "
         "includes the launch gaps of short calls"),
    Mode("graph", "gpu", ("block",),
         "CUDA/HIP graph replay of a small capture, events around each replay, divided by its calls "
         "(warm cache)"),
    Mode("kernel", "gpu", ORDERS,
         "device time of the kernels each call launched, from torch.profiler: no host overhead"),
)

_BY_NAME = {m.name: m for m in TABLE}


def check_order(order: str) -> str:
    """``order`` if it is one of :data:`ORDERS`; else :class:`UsageError` naming it."""
    if order not in ORDERS:
        raise bad_choice("order", order, ORDERS)
    return order


def names(order: str) -> tuple[str, ...]:
    """The modes ``order``'s timer takes, in :data:`TABLE` order. Raises :class:`UsageError`
    for an unknown order."""
    check_order(order)
    return tuple(m.name for m in TABLE if order in m.orders)


def _for(order: str, gpu: bool) -> tuple[str, ...]:
    """The modes ``order``'s timer takes on a GPU (``gpu``) or on the CPU."""
    return tuple(m for m in names(order) if _BY_NAME[m].device in ("any", "gpu" if gpu else "cpu"))


def _or(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def check(mode: str, order: str, gpu: bool | None = None) -> str:
    """``mode`` if ``order``'s timer takes it and (with ``gpu`` given: True for a GPU, False for
    the CPU) it runs on that device. Otherwise raises :class:`~flyexplore.errors.UsageError` (a
    ``ValueError``) naming the mode: not in :data:`TABLE`, a mode of the other order only, a GPU
    mode on the CPU or a CPU mode on a GPU; and for an unknown ``order``."""
    check_order(order)
    m = _BY_NAME.get(mode) if isinstance(mode, str) else None
    if m is None:
        raise bad_choice("timing mode", mode, names(order))
    if order not in m.orders:
        raise UsageError(f"timing mode {mode!r} works in {' and '.join(m.orders)} order only "
                         f"(valid in {order} order: {', '.join(names(order))})")
    if gpu is False and m.device == "gpu":
        raise UsageError(f"timing mode {mode!r} needs a GPU; on the CPU use {_or(_for(order, False))}")
    if gpu is True and m.device == "cpu":
        raise UsageError(f"timing mode {mode!r} is for the CPU; on a GPU use {_or(_for(order, True))}")
    return mode


def effective(mode: str, order: str, gpu: bool, custom_clock: bool = False) -> str:
    """The mode that really runs for ``mode`` (checked by :func:`check`): ``auto`` as in
    :data:`AUTO`; on the CPU ``cpu-wall`` in place of ``cpu-thread`` when the caller gave its own
    clock (``custom_clock``: a clock stands for wall time; thread time cannot be swapped)."""
    check(mode, order, gpu)
    eff = AUTO[order]["gpu" if gpu else "cpu"] if mode == "auto" else mode
    return "cpu-wall" if not gpu and custom_clock else eff


def auto_text() -> str:
    """What ``auto`` becomes, as help text (from :data:`AUTO`)."""
    cpu = {AUTO[o]["cpu"] for o in ORDERS}
    cpu_text = (f"{cpu.pop()} on CPU" if len(cpu) == 1
                else ", ".join(f"{AUTO[o]['cpu']} ({o})" for o in ORDERS) + " on CPU")
    return cpu_text + ", " + " or ".join(f"{AUTO[o]['gpu']} ({o})" for o in ORDERS) + " on GPU"


def listing() -> str:
    """The table as help text: each order's modes on one line, then one line per mode (its
    device, the orders that take it, its meaning)."""
    lines = ["timing modes: " + "; ".join(f"{o} order: {', '.join(names(o))}" for o in ORDERS)]
    width = max(len(m.name) for m in TABLE)
    for m in TABLE:
        dev = {"any": "CPU/GPU", "cpu": "CPU", "gpu": "GPU"}[m.device]
        lines.append(f"  {m.name:{width}s}  {dev:7s}  {'/'.join(m.orders):18s}  {m.meaning}")
    return "\n".join(lines)

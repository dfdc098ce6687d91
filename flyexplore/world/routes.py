"""What the environment layer knows about operators: each FlyDSL route's operator name, route
(``"eager"``, ``"compile"``, ``"aotriton"``), the torch module of an eager override and the aten
symbols it registers. The operator catalogue (:mod:`flyexplore.ops`, one layer up) has them;
the package's root (``flyexplore/__init__.py``, the composition root) hands the catalogue's
:func:`flyexplore.ops.route_table` over with :func:`provide`, so that readiness, switch state and
the environment report never import the catalogue itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class Route:
    """One operator's FlyDSL route as the environment layer needs it: ``op`` (catalogue name),
    ``route`` (``eager`` / ``compile`` / ``aotriton``), ``module`` (torch module of an eager
    override, ``None`` otherwise) and ``aten_ops`` (the aten symbols that override registers;
    torch 2.15: ``_fused_rms_norm``, ``topk`` / ``topk.values``)."""

    op: str
    route: str
    module: str | None = None
    aten_ops: tuple[str, ...] = ()


_source: Callable[[], Iterable[Route]] | None = None


def provide(source: Callable[[], Iterable[Route]]) -> None:
    """Install ``source``, a function returning every operator's :class:`Route` in catalogue
    order (called anew on each read, so operators registered later are seen)."""
    global _source
    _source = source


def routes(route: str | None = None) -> tuple[Route, ...]:
    """Every operator's FlyDSL route, optionally only those of one ``route``. Raises
    ``RuntimeError`` when nothing has provided them (the package root always does)."""
    if _source is None:
        raise RuntimeError("no operator catalogue has provided its FlyDSL routes (flyexplore.world.routes.provide)")
    return tuple(r for r in _source() if route is None or r.route == route)


def route_ops(route: str | None = None) -> tuple[str, ...]:
    """Names of the operators of :func:`routes` (``route``: as there)."""
    return tuple(r.op for r in routes(route))


def route_of(op: str) -> Route:
    """The :class:`Route` of operator ``op``; ``KeyError`` when it has no FlyDSL route."""
    for r in routes():
        if r.op == op:
            return r
    raise KeyError(op)

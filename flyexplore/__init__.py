"""flyexplore: measure, explain and explore PyTorch's FlyDSL paths on AMD MI350 (gfx950),
and the ATen / Triton / vendor-BLAS / SDPA paths on any CUDA or ROCm GPU or the CPU.

``import flyexplore as fx`` is the one way in. The public names are :data:`__all__`; each is
imported on first use (``import flyexplore`` loads neither torch nor pandas nor plotly):

- run and read: :func:`sweep`, :func:`load`, :func:`speedup`, :func:`geomean`;
- FlyDSL insight: :func:`explain`, :func:`trace`, :func:`xray`, :func:`eligibility_grid`;
  :func:`flydsl`, :func:`set_flydsl` (the switches); :func:`collect` (the environment);
- views: :func:`figure`, :func:`report`;
- the catalogue: :func:`get_op`, :func:`list_ops`, :func:`register_op`, :class:`Operator`,
  :class:`FlyDSLPath`, :class:`KernelPattern`, :class:`PublishedSuite`
  (``docs/adding-an-operator.md``);
- measuring building blocks: :class:`Timer` -> :class:`Measurement`, :func:`measure_interleaved`.

The package is folders by layer (``docs/architecture.md``): ``measure``, ``world``, ``ops``,
``insight``, ``results``, ``run``, ``views``, ``ui``, ``cli``; imports only go down.
"""
from __future__ import annotations

import importlib

from flyexplore._version import __version__
from flyexplore.world import routes as _routes


def _catalogue_routes():
    # the composition root: the environment layer (world) never imports the catalogue (ops), so
    # the catalogue's FlyDSL routes are handed to it here, imported on first need so that
    # `import flyexplore` stays light
    from flyexplore.ops import route_table

    return route_table()


_routes.provide(_catalogue_routes)

#: public name -> the module that defines it.
_API = {
    "sweep": "_api", "explain": "_api", "trace": "_api", "xray": "_api", "load": "_api",
    "speedup": "_api", "geomean": "_api", "figure": "_api", "report": "_api",
    "collect": "world.env",
    "get_op": "ops", "list_ops": "ops", "register_op": "ops", "unregister_op": "ops",
    "Operator": "ops", "FlyDSLPath": "ops", "KernelPattern": "ops", "PublishedSuite": "ops",
    "Timer": "measure.timing", "Measurement": "measure.timing", "measure_interleaved": "measure.interleaved",
    "save": "results.table", "pair": "results.compare",
    "eligibility_grid": "insight.explain",
    "Explanation": "world.conditions", "TensorDesc": "world.conditions",
    "flydsl": "world.switches", "set_flydsl": "world.switches",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flyexplore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))

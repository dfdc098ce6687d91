"""flyexplore: measure, explain and explore PyTorch's FlyDSL paths on AMD MI350 (gfx950),
and the ATen / Triton / vendor-BLAS / SDPA paths on any CUDA or ROCm GPU or the CPU.

The public API is :data:`__all__`; each name is documented where it lives and imported on first
use (``import flyexplore`` loads neither torch nor pandas):

- environment: :func:`collect` (``flyexplore.env``).
- operators: :func:`get_op`, :func:`list_ops`, :func:`register_op`, :class:`Operator`,
  :class:`FlyDSLPath`, :class:`KernelPattern`, :class:`PublishedSuite` (``flyexplore.ops``;
  one place per family, ``docs/adding-an-operator.md``).
- measuring: :class:`Timer` -> :class:`Measurement`, :func:`measure_interleaved`
  (``flyexplore.timing``); :func:`run_sweep` (``flyexplore.sweep``).
- results: :func:`load`, :func:`save`, :func:`speedup`, :func:`geomean_speedup`
  (``flyexplore.results``); :func:`pair` (``flyexplore.compare``).
- FlyDSL insight: :func:`explain_text`, :func:`eligibility_grid` (the modules
  ``flyexplore.explain``, ``flyexplore.trace`` and ``flyexplore.xray`` hold ``explain``,
  ``trace`` and ``xray``); :func:`flydsl`, :func:`set_flydsl` (``flyexplore.switches``).

Figures (``flyexplore.plots``), reports (``flyexplore.report``) and notebook widgets
(``flyexplore.widgets``) are imported by module; the measuring core never imports them.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it.
_API = {
    "collect": "env",
    "get_op": "ops", "list_ops": "ops", "register_op": "ops", "unregister_op": "ops",
    "Operator": "ops", "FlyDSLPath": "ops", "KernelPattern": "ops", "PublishedSuite": "ops",
    "Timer": "timing", "Measurement": "timing", "measure_interleaved": "interleaved",
    "run_sweep": "sweep",
    "load": "results", "save": "results", "speedup": "results", "geomean_speedup": "results",
    "pair": "compare",
    "explain_text": "explain", "eligibility_grid": "explain",
    "Explanation": "conditions", "TensorDesc": "conditions",
    "flydsl": "switches", "set_flydsl": "switches",
}
# ``explain``, ``trace`` and ``xray`` are modules of the package (``flyexplore.explain.explain``,
# ``flyexplore.trace.trace``, ``flyexplore.xray.xray``): a function of the same name here would
# shadow them for ``from flyexplore import explain``.

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flyexplore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))

"""flyexplore: measure, explain and explore PyTorch's FlyDSL paths on AMD MI350 (gfx950),
and the ATen / Triton / vendor-BLAS / SDPA paths on any CUDA or ROCm GPU or the CPU.

``import flyexplore as fx`` is the one way in; README, docs and notebooks use nothing else. The
public names are :data:`__all__`; each is imported on first use (``import flyexplore`` loads
neither torch nor pandas nor plotly):

- run and read: :func:`sweep` (of a :class:`SweepSpec`; with ``envs=``, an A/B of environments --
  two torch builds, flydsl versions, library settings -- timed round by round on one GPU),
  :func:`load`, :func:`save`, :func:`speedup`, :func:`geomean`,
  :func:`compare` (A/B of two result sets, of one environment A/B file, or of vLLM runs),
  :func:`published` (the MI355X figures),
  :func:`peaks`, :func:`data_dir`, :func:`walkthrough` (what the notebooks sweep per size);
- whole models: :func:`capture` (every call of one forward step, no GPU, no weights) and
  :func:`model` (each call judged, what-if advice, shares, projection, shapes to sweep);
- FlyDSL insight: :func:`explain`, :func:`eligibility_grid`, :func:`trace`, :func:`autotune`,
  :func:`xray`, :func:`xray_figure`, :func:`kernels`, :func:`aotriton_ab`, :func:`mx_blocks`,
  :func:`mx_errors`; the switches :func:`switches`, :func:`flydsl`, :func:`set_flydsl`,
  :func:`sdpa`; the environment :func:`collect`;
- views: :func:`figure`, :func:`export`, :func:`files`, :func:`summary`, :func:`report`;
- results over time: :func:`history` (a store of runs: trends, steps where they happened, the CI
  gate, BMF export, figure and report; a :class:`History`);
- notebook widgets (need the ``notebook`` extra): :class:`SweepPanel`, :class:`SwitchPanel`,
  :class:`DispatchInspector`, :class:`ModelPanel`, :func:`environment_view`, :class:`EnvPicker`
  (the environments of an A/B);
- the catalogue: :func:`get_op`, :func:`list_ops`, :func:`register_op`, :func:`unregister_op`,
  :class:`Operator`, :class:`FlyDSLPath`, :class:`KernelPattern`, :class:`PublishedSuite`,
  :class:`ModelHooks`, :class:`ModelCall` (``docs/adding-an-operator.md``), :class:`Explanation`, :class:`TensorDesc`;
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
    **dict.fromkeys(("sweep", "load", "speedup", "geomean", "compare", "published", "peaks", "walkthrough",
                     "explain", "trace", "autotune", "xray", "xray_figure", "kernels", "switches",
                     "mx_blocks", "mx_errors", "aotriton_ab", "figure", "export", "files", "summary",
                     "report", "capture", "model"), "_api"),
    "collect": "world.env", "flydsl": "world.switches", "set_flydsl": "world.switches", "sdpa": "world.switches",
    "data_dir": "paths",
    "get_op": "ops", "list_ops": "ops", "register_op": "ops", "unregister_op": "ops",
    "Operator": "ops", "FlyDSLPath": "ops", "KernelPattern": "ops", "PublishedSuite": "ops",
    "ModelHooks": "ops", "ModelCall": "ops",
    "Timer": "measure.timing", "Measurement": "measure.timing", "measure_interleaved": "measure.interleaved",
    "save": "results.table", "SweepSpec": "run.spec",
    "eligibility_grid": "insight.explain",
    "Explanation": "world.conditions", "TensorDesc": "world.conditions",
    "SweepPanel": "ui.panel", "SwitchPanel": "ui.widgets", "DispatchInspector": "ui.inspector",
    "ModelPanel": "ui.model", "environment_view": "ui.widgets", "EnvPicker": "ui.envs",
    "history": "views.history", "History": "views.history",
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

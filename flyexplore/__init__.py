"""flyexplore: measure, explain and explore PyTorch's FlyDSL paths on AMD MI350 (gfx950),
and the ATen / Triton / vendor-BLAS / SDPA paths on any CUDA or ROCm GPU or the CPU.

Public entry points (each documented where it lives):

- :func:`flyexplore.env.collect` -- the environment report.
- :mod:`flyexplore.ops` -- the operator catalogue (``get_op``, ``list_ops``).
- :class:`flyexplore.timing.Timer` -- honest timing, returning a :class:`~flyexplore.timing.Measurement`.
- :func:`flyexplore.sweep.run_sweep` -- sweeps that keep every row.
- :mod:`flyexplore.results` -- the result schema, load/save, speedups and geometric means.
- :func:`flyexplore.xray.xray` -- compile the FlyDSL kernel torch would run on gfx950 (no GPU
  needed) and show its registers, LDS, occupancy, instruction mix and ISA.
- :mod:`flyexplore.switches` -- FlyDSL on/off per operator (plain calls and contexts).
- :func:`flyexplore.explain.explain` -- will a call take FlyDSL, and if not, why not.
- :func:`flyexplore.trace.trace` -- the kernels a call really ran, and autotune decisions.
"""
__version__ = "0.1.0"

"""This process's facts for the readiness model (:class:`flyexplore.world.readiness.EnvFacts`): the
torch build, flydsl, the device, the switches and the Inductor settings, gathered from
:func:`flyexplore.world.env.collect` and :mod:`flyexplore.world.switches`, or assumed for what-if questions.
Kept apart from :mod:`flyexplore.world.readiness` (the rules) so that the environment report and the
switches can use the rules without importing each other through it."""
from __future__ import annotations

import os
from typing import Any, Mapping

from flyexplore.world import env as ENV
from flyexplore.world import switches as S
from flyexplore.world.readiness import FLYDSL_ARCH, FLYDSL_SERIES, MI355X_CUS, EnvFacts, flydsl_built, is_installed
from flyexplore.world.routes import route_of, route_ops

_ENV_KEYS = ("FLYDSL_GPU_ARCH", "HSA_OVERRIDE_GFX_VERSION", "TORCH_DISABLE_NATIVE_JIT",
             "TORCH_NATIVE_SKIP_VERSION_CHECK")


def facts(*, arch: str | None = None, cu: int | None = None, assume_rocm: bool = False,
          compile_options: Mapping[str, Any] | None = None,
          environ: Mapping[str, str] | None = None) -> EnvFacts:
    """Collect the :class:`EnvFacts` of this process.

    ``arch``: take this as the device's gcnArchName (a what-if; eager env overrides still
    apply). ``cu``: CU count for TopK's row gate (default: the ROCm device's, else 256 =
    MI355X). ``assume_rocm``: assume a ROCm torch 2.15 with flydsl 0.3.x, the overrides
    registered, on ``arch`` (default gfx950). ``compile_options``: Inductor options as given
    to ``torch.compile(options=...)`` on top of the current ``torch._inductor.config``.
    """
    import torch
    from torch._inductor import config as ic


    eager = route_ops("eager")
    environ = dict(os.environ if environ is None else environ)
    env = ENV.collect()
    ind = {k: getattr(ic, k, None) for k in ("max_autotune", "max_autotune_gemm", "max_autotune_gemm_backends",
                                             "max_autotune_gemm_search_space", "flydsl_enable_autotuning",
                                             "assume_aligned_inputs")}
    for k, v in (compile_options or {}).items():
        if k == "mode":
            if v in ("max-autotune", "max-autotune-no-cudagraphs"):
                ind["max_autotune"] = True
            continue
        ind[k] = v
    rocm = env.platform == "rocm" or bool(getattr(torch.version, "hip", None))
    dev_arch = env.device.arch if env.platform == "rocm" else None
    if arch:
        dev_arch = arch
    if cu is not None:
        cus, cu_src = int(cu), "given"
    elif env.platform == "rocm":
        cus, cu_src = env.device.compute_units, f"{env.device.name}"
    else:
        cus, cu_src = MI355X_CUS, "assumed MI355X"
    fly_v = env.versions.get("flydsl")
    fly_v = fly_v if is_installed(fly_v) else None
    eager_mods = {op: S.eager_mechanism(op) is None for op in eager}
    eager_sw = None
    sets = S.eager_filter_sets()
    if sets is not None:
        dsl, syms, keys = sets
        eager_sw = {op: ("flydsl" not in dsl, tuple(s for s in route_of(op).aten_ops if s in syms), "CUDA" in keys)
                    for op in eager}
    registered = S.registered_overrides()
    assumed = None
    if assume_rocm:
        dev_arch = arch or FLYDSL_ARCH
        assumed = (f"a ROCm build of torch 2.15 with flydsl 0.3.x, overrides registered, device "
                   f"{dev_arch} with {cus} CUs ({cu_src}); switches and settings as in this process")
        return EnvFacts("2.15 (assumed)", True, "%d.%d" % FLYDSL_SERIES, True, {op: True for op in eager}, True,
                        dev_arch, cus, cu_src, {k: environ[k] for k in _ENV_KEYS if k in environ},
                        eager_sw or {op: (True, (), False) for op in eager}, None, ind, assumed)
    return EnvFacts(torch.__version__, rocm, fly_v, flydsl_built(), eager_mods, S.compile_mechanism() is None,
                    dev_arch, cus, cu_src, {k: environ[k] for k in _ENV_KEYS if k in environ},
                    eager_sw, registered, ind, None)

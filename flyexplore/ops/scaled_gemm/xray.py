"""Kernel X-ray of the scaled GEMM family (:mod:`flyexplore.insight.xray`): an MXFP8/MXFP4 scaled GEMM
lowers to Inductor's MXFP ``mm_flydsl`` template, the dense GEMM kernels with MXFP operands, so
its X-ray is the GEMM family's (:func:`flyexplore.ops.gemm.xray.build`) with dtype
``mxfp8``/``mxfp4`` and layout NT. :data:`XRAY` maps an explainer case to that request.
"""
from __future__ import annotations

from flyexplore.ops import get_op
from flyexplore.ops.gemm import xray as gemm_xray
from flyexplore.ops.gemm.xray import MXFP
from flyexplore.ops.xray_kit import XRayVerdict

#: Why FP8 scaled GEMMs with other scalings have no X-ray (see flyexplore.insight.xray.NOT_COVERED).
NOT_MX = "FlyDSL takes only the MX BlockWise1x32 recipe (mxfp8 / mxfp4)"


def request(shape: str, dtype: str) -> tuple[str, str, str] | str:
    """A scaled GEMM case (the catalogue's ``MxNxK[:scaling=...]``) as the GEMM X-ray's request
    ``("gemm", "MxNxK", dtype)``, or the reason there is none (an FP8 dtype other than MX).
    Raises :class:`~flyexplore.errors.UsageError` for a malformed shape."""
    if dtype not in MXFP:
        return f"{dtype} scaled GEMM is not covered: {NOT_MX}"

    p = get_op("scaled_gemm").case(str(shape).strip()).p
    return "gemm", f"{p['m']}x{p['n']}x{p['k']}", dtype


def build(p, dtype, torch_dtype, arch, autotune=False) -> XRayVerdict:
    """This family's X-ray builder (``FlyDSLPath.xray``): an MX scaled GEMM is built by the GEMM
    family's builder (:func:`flyexplore.ops.gemm.xray.build`, its MXFP ``mm_flydsl`` template);
    arguments as there."""
    return gemm_xray.build(p, dtype, torch_dtype, arch, autotune)


#: The family's X-ray spec (keys described in :func:`flyexplore.insight.xray.xray_spec`): no ``dtypes``
#: of its own -- requests go to the GEMM family.
XRAY = {"request": request}

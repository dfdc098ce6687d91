"""The explainer's verdict against torch 2.15's own predicates: 100% agreement required.

Eager predicates (RMSNorm, TopK) are called directly on FakeTensors that claim ``cuda:0``,
with ``FLYDSL_GPU_ARCH=gfx950`` set and torch's per-process arch caches cleared around the
module, and TopK's CU count (``_min_rows_for_full_wave``, which reads the real device)
replaced by the count under test.

Inductor predicates take IR nodes, so they are called on ``InputBuffer`` nodes built under a
``GraphLowering`` handler (as Inductor's lowering holds them for graph inputs), with input
alignment decided by torch's ``should_assume_input_aligned`` on a FakeTensor of the same
storage offset. Only the environment half of ``use_flydsl_gemm_template`` is replaced (ROCm
build, flydsl runtime, device arch, ``is_big_gpu``: this machine has no ROCm GPU); its dtype
and config half, and every shape/stride/dtype rule after it, run as torch wrote them. For
MXFP the stride fix-up of ``scaled_mm_v2_constraint`` (which needs an FX node) is applied by
the harness with torch's ``ExternKernel.require_exact_strides``, following the rule that
constraint states (A kept when stride[1] == 1, else made row-major; B kept when
stride[0] == 1, else made column-major).
"""
from __future__ import annotations

import contextlib
import importlib.util
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("torch._native.ops.norm.flydsl_rmsnorm_impl") is None:  # pragma: no cover
    pytest.fail("these tests need torch >= 2.15 (the FlyDSL integration); requirements.txt pins it")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from conftest import examples  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flyexplore.insight import explain as E  # noqa: E402
from flyexplore.world import readiness as RD  # noqa: E402
from flyexplore.ops.gemm import flydsl as GF  # noqa: E402
from flyexplore.ops.grouped_gemm import flydsl as GGF  # noqa: E402
from flyexplore.ops.rmsnorm import flydsl as RF  # noqa: E402
from flyexplore.ops.scaled_gemm import flydsl as SF  # noqa: E402
from flyexplore.ops.topk import flydsl as TF  # noqa: E402

SETTINGS = settings(max_examples=examples(300, quick=50), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _clear_arch_caches():
    """torch caches the arch per process, and the FlyDSL config lists (validated against the
    arch's LDS size) per process too: clear both."""
    from torch._inductor.heuristics.template import flydsl as H
    from torch._native import flydsl_utils as fu
    for fn in (fu._resolve_rocm_arch, fu._is_supported_arch, fu._get_flydsl_device_arch,
               H.get_default_gemm_configs, H.get_exhaustive_gemm_configs, H.get_default_grouped_gemm_configs,
               H.get_exhaustive_grouped_gemm_configs, H._get_mxfp_candidates):
        fn.cache_clear()


@pytest.fixture(scope="module")
def gfx950():
    """FLYDSL_GPU_ARCH=gfx950 for this module; torch's arch caches cleared before and after."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYDSL_GPU_ARCH", "gfx950")
        mp.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
        _clear_arch_caches()
        yield
    _clear_arch_caches()
    from flyexplore.world import env
    env._collect_cached.cache_clear()   # nothing collected under FLYDSL_GPU_ARCH survives this module


@pytest.fixture(scope="module")
def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _fake(mode, shape, stride, dtype, offset=0, device="cuda:0"):
    with mode:
        need = 1 + offset + sum((s - 1) * abs(st_) for s, st_ in zip(shape, stride) if s > 0)
        base = torch.empty(max(need, 1), dtype=dtype, device=device)
        return base.as_strided(shape, stride, offset)


def _call_ok(conds) -> bool:
    return all(c.ok is True for c in conds if c.kind in ("call", "config"))


# -- RMSNorm ------------------------------------------------------------------------------

_RMS_M = [1, 3, 2047, 2048, 2049, 4095, 4096, 8191, 8192, 65536, 1 << 20]
_RMS_N = [1, 8, 4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384, 65536, 114688, 114689, 1 << 17]
#: (M, N) pairs inside the tuned region, on its edges.
_RMS_IN = [(8192, 4096), (8192, 8191), (4096, 8192), (4096, 16383), (2048, 16384), (2048, 114688),
           (65536, 4097), (1 << 20, 4096)]
_DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
#: (M, N) pairs just outside it.
_RMS_OUT = [(8191, 4096), (8191, 8191), (4095, 8192), (4095, 16383), (2047, 16384), (2048, 114689),
            (65536, 4095), (65536, 1 << 17)]
_RMS_MUT = ["region", "near", "rank1", "rank3", "dtype", "transposed", "padded", "offset", "ns_int", "ns_two",
            "ns_wrong", "w_none", "w_dtype", "w_shape", "w_noncontig", "w_cpu", "eps_none", "eps_zero",
            "eps_neg", "eps_nan", "huge"]


@st.composite
def rms_cases(draw):
    """An eligible call, then none or one change (half the draws), so that both verdicts and
    every rule's edge are exercised."""
    mut = draw(st.sampled_from([None] * len(_RMS_MUT) + _RMS_MUT))
    m, n = draw(st.sampled_from(_RMS_IN))
    if mut == "region":
        m, n = draw(st.sampled_from(_RMS_M)), draw(st.sampled_from(_RMS_N))
    if mut == "near":
        m, n = draw(st.sampled_from(_RMS_OUT))
    if mut == "huge":
        m, n = (1 << 20), 4096 * 2  # 2^33 bytes in fp32: beyond the 32-bit span
    shape = {"rank1": (n,), "rank3": (2, max(m // 2, 1), n)}.get(mut, (m, n))
    dt = draw(st.sampled_from(["fp64"] if mut == "dtype" else ["fp32", "fp16", "bf16"]))
    if mut == "huge":
        dt = "fp32"
    stride = list(E.contiguous_strides(shape))
    if mut == "transposed":
        stride[-1], stride[-2] = shape[-2], 1
    elif mut == "padded":
        stride[-2] = shape[-1] + 64
    offset = 8 if mut == "offset" else 0
    normalized = {"ns_int": n, "ns_two": list(shape[-2:]), "ns_wrong": [n + 1]}.get(mut, [n])
    w = {"w_none": "none", "w_dtype": "dtype", "w_shape": "shape", "w_noncontig": "noncontig", "w_cpu": "cpu"}.get(mut, "ok")
    eps = {"eps_none": None, "eps_zero": 0.0, "eps_neg": -1e-3, "eps_nan": float("nan")}.get(mut, 1e-6)
    return shape, tuple(stride), dt, offset, normalized, w, eps


@SETTINGS
@given(rms_cases())
def test_rmsnorm_agrees_with_torch(gfx950, fake_mode, case):
    from torch._native.ops.norm import flydsl_rmsnorm_impl as R

    shape, stride, dt, offset, normalized, wkind, eps = case
    x = _fake(fake_mode, shape, stride, _DT[dt], offset)
    n = shape[-1]
    wdt = torch.float16 if (wkind == "dtype" and dt != "fp16") else torch.float32 if wkind == "dtype" else _DT[dt]
    w = {"none": None,
         "ok": _fake(fake_mode, (n,), (1,), _DT[dt]),
         "dtype": _fake(fake_mode, (n,), (1,), wdt),
         "shape": _fake(fake_mode, (n + 1,), (1,), _DT[dt]),
         "noncontig": _fake(fake_mode, (n,), (2,), _DT[dt]) if n > 1 else _fake(fake_mode, (n,), (1,), _DT[dt]),
         "cpu": _fake(fake_mode, (n,), (1,), _DT[dt], device="cpu")}[wkind]
    want = bool(R._fused_rms_norm_cond(x, normalized, w, eps))
    got = _call_ok(RF.rmsnorm_rules(x, normalized, w, eps))
    assert got == want, (case, [c for c in RF.rmsnorm_rules(x, normalized, w, eps) if c.ok is False])


def test_rmsnorm_published_cases_all_eligible(gfx950, fake_mode):
    """Every published MI355X RMSNorm case (data/published/rmsnorm.csv) lies in the tuned
    region, by torch's predicate and by ours."""
    import csv

    from torch._native.ops.norm import flydsl_rmsnorm_impl as R

    from flyexplore.paths import published_dir

    rows = list(csv.DictReader(open(published_dir() / "rmsnorm.csv")))
    assert len(rows) == 22
    for r in rows:
        m, n, dt = int(r["m"]), int(r["n"]), _DT[r["dtype"]]
        x = _fake(fake_mode, (m, n), (n, 1), dt)
        w = _fake(fake_mode, (n,), (1,), dt)
        assert R._fused_rms_norm_cond(x, [n], w, 1e-6)
        assert _call_ok(RF.rmsnorm_rules(x, [n], w, 1e-6)), r


# -- TopK ---------------------------------------------------------------------------------

_TK_K = [1, 2, 3, 4, 8, 16, 17, 32, 63, 64, 128, 256, 257, 383, 384, 512, 831, 832, 1000, 1024, 1025]
_TK_N = [1000, 1024, 1536, 2048, 4096, 8191, 8192, 8193, 16383, 16384, 32768, 32769, 65536, 131072,
         131073, 262144, 262145]
#: (K, N) pairs that have a FlyDSL kernel, on the band edges.
_TK_IN = ([(k, n) for k in (2, 4, 8, 16) for n in (1024, 2048, 8192)]
          + [(64, 8192), (256, 32768), (257, 16384), (383, 32768), (384, 32768), (831, 131072),
             (832, 32768), (1024, 262144)])
_TK_MUT = ["band", "rank1", "rank3", "dtype", "noncontig", "dim0", "dim_neg", "dim_bad", "smallest",
           "unsorted", "rows", "cu"]


@st.composite
def topk_cases(draw):
    mut = draw(st.sampled_from([None] * len(_TK_MUT) + _TK_MUT))
    k, n = draw(st.sampled_from(_TK_IN))
    if mut == "band":
        k, n = draw(st.sampled_from(_TK_K)), draw(st.sampled_from(_TK_N))
    cu = draw(st.sampled_from([256, 80, 304])) if mut == "cu" else 256
    m = draw(st.sampled_from([1, 255])) if mut == "rows" else draw(st.sampled_from([256, 257, 1024]))
    shape = {"rank1": (n,), "rank3": (2, m, n)}.get(mut, (m, n))
    rank = len(shape)
    dt = draw(st.sampled_from(["bf16", "fp16", "fp64"])) if mut == "dtype" else "fp32"
    stride = list(E.contiguous_strides(shape))
    if mut == "noncontig" and rank >= 2:
        stride[-2] = n + 32
        if rank == 3:
            stride[0] = stride[1] * m
    dim = {"dim0": 0, "dim_neg": -rank, "dim_bad": rank}.get(mut, draw(st.sampled_from([-1, rank - 1])))
    largest, sorted_ = mut != "smallest", mut != "unsorted"
    return shape, tuple(stride), dt, k, dim, largest, sorted_, cu


@SETTINGS
@given(topk_cases())
def test_topk_agrees_with_torch(gfx950, fake_mode, case):
    from torch._native.ops.topk import flydsl_impl as T

    shape, stride, dt, k, dim, largest, sorted_, cu = case
    x = _fake(fake_mode, shape, stride, _DT[dt])
    with mock.patch.object(T, "_min_rows_for_full_wave", lambda idx: cu):
        want = bool(T._cond(x, k, dim, largest, sorted_))
    conds, kernel = TF.topk_rules(x, k, dim, largest, sorted_, cu, "test")
    assert _call_ok(conds) == want, (case, [c for c in conds if c.ok is False])
    n = shape[-1]
    fam = T._kernel_for(k, n)
    assert (kernel.split()[0] if kernel else None) == fam, (k, n, kernel, fam)


def test_topk_kernel_bands_match_torch():
    """Every (K, N) on the band edges gets the same family, and the radix band we name
    contains (K, N)."""
    from torch._native.ops.topk import flydsl_impl as T

    ks = sorted({k + d for k in (2, 4, 8, 16, 64, 256, 257, 383, 384, 831, 832, 1024) for d in (-1, 0, 1)})
    ns = sorted({n + d for n in (1024, 2048, 4096, 8192, 16384, 32768, 131072, 262144) for d in (-1, 0, 1)})
    for k in ks:
        for n in ns:
            ours = TF.topk_kernel(k, n)
            assert (ours.split()[0] if ours else None) == T._kernel_for(k, n), (k, n)
            if ours and ours.startswith("radix"):
                lo, hi = (int(v) for v in ours.split("K ")[1].split(",")[0].split("-"))
                assert lo <= k <= hi


# -- Inductor: the IR harness ---------------------------------------------------------------

@contextlib.contextmanager
def inductor_harness(**config):
    """A GraphLowering handler and the environment half of use_flydsl_gemm_template made true."""
    import torch._inductor.codegen.flydsl.flydsl_scheduling as ifs
    import torch._inductor.codegen.flydsl.flydsl_utils as ifu
    import torch._inductor.utils as iu
    from torch._inductor import config as ic
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    gm = torch.fx.symbolic_trace(torch.nn.Identity())
    graph = GraphLowering(gm)
    cfg = {"max_autotune": True, "max_autotune_gemm_backends": "FLYDSL", **config}
    with V.set_graph_handler(graph), mock.patch.object(torch.version, "hip", "7.0.0"), \
            mock.patch.object(iu, "is_big_gpu", lambda *a, **k: True), \
            mock.patch.object(ifu, "runtime_available", lambda: True), \
            mock.patch.object(ifs, "_get_flydsl_device_arch", lambda idx: "gfx950"), \
            ic.patch(**cfg):
        yield graph


_COUNTER = iter(range(10**9))


def _ir_input(graph, mode, desc: E.TensorDesc):
    """An Inductor graph input for ``desc``: InputBuffer (layout offset 0, as graph.placeholder
    makes it), listed in unaligned_buffers when torch's should_assume_input_aligned says so."""
    from torch._inductor import ir
    from torch._inductor.utils import should_assume_input_aligned

    name = f"arg{next(_COUNTER)}"
    dev = torch.device(desc.device)
    node = ir.TensorBox.create(ir.InputBuffer(name=name, layout=ir.FixedLayout(dev, desc.dtype, list(desc.shape),
                                                                                  list(desc.stride))))
    fake = _fake(mode, desc.shape, desc.stride, desc.dtype, desc.storage_offset, desc.device)
    if not should_assume_input_aligned(fake):
        graph.unaligned_buffers.add(name)
    return node


_DIMS = [0, 1, 8, 16, 24, 32, 48, 64, 100, 128, 1000, 1024, 4096, 4104]
_MM_IN = [(8, 4096, 4096), (16, 28672, 4096), (4096, 4096, 4096), (64, 8, 32), (1, 4104, 96), (24, 1024, 64)]
_MM_MUT = ["dims", "m0", "k0", "dtype", "dtype_b", "a_col", "b_row", "a_pad", "b_pad", "a_pad_odd", "b_pad_odd",
           "a_odd", "b_odd", "a_off", "b_off", "a_off16", "a_col_m", "a_col_pad", "a_col_pad_ok", "big",
           "a_nounit", "b_nounit", "both_nounit", "a_nounit_k"]


@st.composite
def mm_cases(draw):
    """An eligible aten.mm (NT by default), then none or one change."""
    mut = draw(st.sampled_from([None] * len(_MM_MUT) + _MM_MUT))
    m, n, k = draw(st.sampled_from(_MM_IN))
    if mut == "dims":
        m, n, k = (draw(st.sampled_from(_DIMS)) for _ in range(3))
    m, k = {"m0": (0, k), "k0": (m, 0), "a_col_m": (12, 64), "a_col_pad": (12, 64), "a_col_pad_ok": (24, 64),
                     "big": (65536, 32768)}.get(mut, (m, k))
    dt = draw(st.sampled_from([torch.float32] if mut == "dtype" else [torch.bfloat16, torch.float16]))
    dtb = (torch.float16 if dt == torch.bfloat16 else torch.bfloat16) if mut == "dtype_b" else dt
    if mut == "a_nounit_k":
        k = draw(st.sampled_from([48, 100, 512]))
    # no unit stride (Mamba's x_proj: a [B, D, L+3] conv output's last column, stride (4D, 4),
    # offset 3): mm_args copies the operand into a contiguous buffer before the FlyDSL check
    nounit_a, nounit_b = (4 * k, 4), (2, 2 * k)
    a_stride = {"a_col": (1, m), "a_col_m": (1, m), "a_pad": (k + 64, 1), "a_pad_odd": (k + 3, 1),
                "a_odd": (2, 2 * m), "a_col_pad": (1, 16), "a_col_pad_ok": (1, 32), "a_nounit": nounit_a,
                "both_nounit": nounit_a, "a_nounit_k": nounit_a}.get(mut, (k, 1))
    b_stride = {"b_row": (n, 1), "b_pad": (1, k + 64), "b_pad_odd": (1, k + 3), "b_odd": (2, 2 * k),
                "b_nounit": nounit_b, "both_nounit": nounit_b}.get(mut, (1, k))
    a_off = {"a_off": 1, "a_off16": 8, "a_nounit": 3, "both_nounit": 3, "a_nounit_k": 3}.get(mut, 0)
    b_off = {"b_off": 3, "b_nounit": 5, "both_nounit": 1}.get(mut, 0)
    a = E.TensorDesc((m, k), dt, a_stride, a_off)
    b = E.TensorDesc((k, n), dtb, b_stride, b_off)
    return a, b, draw(st.booleans()), draw(st.sampled_from(["DEFAULT", "DEFAULT", "EXHAUSTIVE"]))


def _torch_mm_offers_flydsl(g, mode, a: E.TensorDesc, b: E.TensorDesc) -> bool:
    """torch's answer for ``aten.mm(a, b)`` as ``tuned_mm`` reaches it: graph inputs through
    ``mm_args`` (``realize_inputs`` -> ``require_stride1``, which copies an operand with no unit
    stride), then ``get_flydsl_mm_template_kwargs`` on what ``mm_args`` returns."""
    import torch._inductor.kernel.mm as MM
    from torch._inductor.kernel.mm_common import _is_static_problem, mm_args

    _, _, _, layout, mat1, mat2 = mm_args(_ir_input(g, mode, a), _ir_input(g, mode, b))
    static, nonzero = _is_static_problem(layout)
    return len(MM.get_flydsl_mm_template_kwargs(layout, mat1, mat2, static, nonzero)) > 0


@SETTINGS
@given(mm_cases())
@pytest.mark.slow
def test_mm_agrees_with_torch(gfx950, fake_mode, case):
    a, b, autotune, space = case
    with inductor_harness(flydsl_enable_autotuning=autotune, max_autotune_gemm_search_space=space) as g:
        want = _torch_mm_offers_flydsl(g, fake_mode, a, b)
    conds = GF.mm_rules(a, b, autotuning=autotune, search_space=space)
    assert _call_ok(conds) == want, (case, [c.detail for c in conds if c.ok is False])


_BF = torch.bfloat16
#: (A, B, FlyDSL offered): operands with no unit stride, which mm_args copies (offset and all).
_NOUNIT = [
    (E.TensorDesc((1, 512), _BF, (2048, 4), 3), E.TensorDesc((512, 48), _BF, (1, 512)), True),   # Mamba x_proj
    (E.TensorDesc((64, 512), _BF, (2048, 4), 3), E.TensorDesc((512, 48), _BF, (1, 512)), True),
    (E.TensorDesc((64, 96), _BF, (2, 128), 1), E.TensorDesc((96, 256), _BF, (2, 192), 7), True),
    (E.TensorDesc((64, 100), _BF, (400, 4), 3), E.TensorDesc((100, 256), _BF, (1, 100)), False),  # K % 32
    (E.TensorDesc((64, 96), _BF, (384, 4), 3), E.TensorDesc((96, 100), _BF, (2, 192)), False),    # N % 8
    (E.TensorDesc((64, 96), torch.float32, (384, 4), 3), E.TensorDesc((96, 64), torch.float32, (1, 96)), False),
    (E.TensorDesc((64, 96), _BF, (384, 4), 3), E.TensorDesc((96, 64), _BF, (1, 96), 3), False),  # B unaligned
]


@pytest.mark.parametrize("a,b,offered", _NOUNIT, ids=[f"{a.text()}x{b.text()}" for a, b, _ in _NOUNIT])
def test_mm_operand_without_unit_stride_is_judged_as_mm_args_copy(gfx950, fake_mode, a, b, offered):
    """Issue 34: tuned_mm runs mm_args first, whose realize_inputs -> require_stride1 copies an
    operand with no stride equal to 1 into a contiguous, aligned buffer; FlyDSL is then judged on
    the copy. torch's entry point (tuned_mm, FlyDSL choices recorded) and the rules agree, and the
    rules say that the copy was made."""
    import torch._inductor.kernel.mm as MM

    offers = []
    with inductor_harness() as g, \
            mock.patch.object(MM.flydsl_mm_template, "maybe_append_choice", lambda *a_, **k: offers.append(k)), \
            mock.patch.object(MM, "autotune_select_algorithm", lambda *a_, **k: (None, None)):
        MM.tuned_mm(_ir_input(g, fake_mode, a), _ir_input(g, fake_mode, b))
        assert _torch_mm_offers_flydsl(g, fake_mode, a, b) == bool(offers)
    assert bool(offers) == offered
    conds = GF.mm_rules(a, b)
    assert _call_ok(conds) == offered, [c.detail for c in conds if c.ok is False]
    copied = [c for c in conds if "copied" in c.name]
    assert len(copied) == (1 not in a.stride) + (1 not in b.stride) and all(c.ok for c in copied)
    assert all("require_stride1" in c.source and "mm_args" in c.source for c in copied)
    ex = E.explain("gemm", a=a, b=b, env=E.facts(assume_rocm=True, compile_options={
        "max_autotune": True, "max_autotune_gemm_backends": "ATEN,FLYDSL"}))
    assert ex.call_ok == offered and "mm_args copies it" in ex.to_text()


@pytest.mark.slow
def test_mm_published_shapes_eligible(gfx950, fake_mode):
    """The 15 published dense BF16 shapes (NT) qualify, by torch and by us, in every mode."""
    import csv

    import torch._inductor.kernel.mm as MM
    from torch._inductor import ir

    from flyexplore.paths import published_dir

    rows = list(csv.DictReader(open(published_dir() / "dense_gemm_bf16.csv")))
    for autotune, space in ((False, "DEFAULT"), (True, "DEFAULT"), (True, "EXHAUSTIVE")):
        with inductor_harness(flydsl_enable_autotuning=autotune, max_autotune_gemm_search_space=space) as g:
            for r in rows:
                m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
                a = E.TensorDesc((m, k), torch.bfloat16)
                b = E.TensorDesc((k, n), torch.bfloat16, (1, k))
                layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [m, n])
                assert MM.get_flydsl_mm_template_kwargs(layout, _ir_input(g, fake_mode, a),
                                                        _ir_input(g, fake_mode, b), True, True)
                assert _call_ok(GF.mm_rules(a, b, autotuning=autotune, search_space=space))


def test_mm_dynamic_shapes_refused(gfx950, fake_mode):
    import torch._inductor.kernel.mm as MM
    from torch._inductor import ir

    a, b = E.TensorDesc((64, 64), torch.bfloat16), E.TensorDesc((64, 64), torch.bfloat16)
    with inductor_harness() as g:
        layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [64, 64])
        assert MM.get_flydsl_mm_template_kwargs(layout, _ir_input(g, fake_mode, a), _ir_input(g, fake_mode, b),
                                                False, True) == []
    assert not _call_ok(GF.mm_rules(a, b, dynamic=True))
    assert _call_ok(GF.mm_rules(a, b))


# -- the gate's switch half: config settings ----------------------------------------------

@pytest.mark.parametrize("backends", ["FLYDSL", "ATEN,TRITON", "aten, flydsl", "ATEN,TRITON,CPP"])
@pytest.mark.parametrize("max_autotune,max_autotune_gemm", [(True, False), (False, True), (False, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gate_switches_agree(gfx950, backends, max_autotune, max_autotune_gemm, dtype):
    import dataclasses

    from torch._inductor import ir
    from torch._inductor.utils import use_flydsl_gemm_template

    with inductor_harness(max_autotune=max_autotune, max_autotune_gemm=max_autotune_gemm,
                          max_autotune_gemm_backends=backends):
        want = use_flydsl_gemm_template(ir.FixedLayout(torch.device("cuda", 0), dtype, [64, 64]))
    f = E.facts(assume_rocm=True)
    f = dataclasses.replace(f, inductor={**f.inductor, "max_autotune": max_autotune,
                                         "max_autotune_gemm": max_autotune_gemm,
                                         "max_autotune_gemm_backends": backends})
    env_ok = all(c.ok for c in RD.compile_environment(f))
    dtype_ok = next(c for c in GF.mm_rules(E.TensorDesc((64, 64), dtype), E.TensorDesc((64, 64), dtype))
                    if c.name == "dtype").ok
    assert (env_ok and dtype_ok) == want


# -- grouped mm ---------------------------------------------------------------------------

_GMM_IN = [(8, 512, 4096, 4096), (8, 512, 2048, 8192), (1, 16, 128, 32), (2, 100, 256, 96), (16, 64, 384, 64)]
_GMM_MUT = ["n64", "n32", "n96", "n_odd", "k48", "k_odd", "m0", "a_pad", "a_col", "b_kmajor", "b_pad", "a_off",
            "a_off16", "b_off", "bias", "scaled", "no_offs", "dtype", "dtype_b", "out_dtype", "big", "a_nounit",
            "b_nounit", "b_nounit_n", "both_nounit"]


@st.composite
def grouped_cases(draw):
    """An eligible grouped mm (N % 128 == 0), then none or one change."""
    mut = draw(st.sampled_from([None] * len(_GMM_MUT) + _GMM_MUT))
    g, mg, n, k = draw(st.sampled_from(_GMM_IN))
    n = {"n64": 64 * 5, "n32": 32 * 3, "n96": 96, "n_odd": 4100}.get(mut, n)
    k = {"k48": 48, "k_odd": 4100}.get(mut, k)
    m = 0 if mut == "m0" else g * mg
    if mut == "big":
        g, m, n, k = 64, 64 * 512, 8192, 8192   # B = 64*8192*8192*2 B: beyond the 32-bit span
    dt = torch.float32 if mut == "dtype" else draw(st.sampled_from([torch.bfloat16, torch.float16]))
    dtb = (torch.float16 if dt == torch.bfloat16 else torch.bfloat16) if mut == "dtype_b" else dt
    odt = torch.float32 if mut == "out_dtype" else None
    n = 96 if mut == "b_nounit_n" else n
    # no unit stride: grouped_mm_args' realize_inputs -> require_stride1 copies the operand
    a_stride = {"a_pad": (k + 32, 1), "a_col": (1, max(m, 1)), "a_nounit": (4 * k, 4),
                "both_nounit": (4 * k, 4)}.get(mut, (k, 1))
    nounit_b = (2 * k * n, 2 * n, 2)
    b_stride = {"b_kmajor": (k * n, 1, k), "b_pad": (k * (n + 32), n + 32, 1), "b_nounit": nounit_b,
                "b_nounit_n": nounit_b, "both_nounit": nounit_b}.get(mut, (k * n, n, 1))
    a_off = {"a_off": 1, "a_off16": 8, "a_nounit": 3, "both_nounit": 3}.get(mut, 0)
    a = E.TensorDesc((m, k), dt, a_stride, a_off)
    b = E.TensorDesc((g, k, n), dtb, b_stride, {"b_off": 3, "b_nounit": 1}.get(mut, 0))
    return (a, b, odt, mut == "bias", mut == "scaled", mut != "no_offs", draw(st.booleans()),
            draw(st.sampled_from(["DEFAULT", "EXHAUSTIVE"])))


@SETTINGS
@given(grouped_cases())
@pytest.mark.slow
def test_grouped_mm_agrees_with_torch(gfx950, fake_mode, case):
    import torch._inductor.kernel.mm_grouped as GM
    from torch._inductor import ir
    from torch._inductor.kernel.mm_common import _is_static_problem

    a, b, odt, bias, scaled, offs, autotune, space = case
    out_dt = odt or a.dtype
    with inductor_harness(flydsl_enable_autotuning=autotune, max_autotune_gemm_search_space=space) as g:
        # as _tuned_grouped_mm_common holds them: through grouped_mm_args (realize_inputs -> require_stride1)
        _, _, _, na, nb, _ = GM.grouped_mm_args(_ir_input(g, fake_mode, a), _ir_input(g, fake_mode, b), None,
                                                out_dtype=odt)
        no = _ir_input(g, fake_mode, E.TensorDesc((b.shape[0],), torch.int32)) if offs else None
        nbias = _ir_input(g, fake_mode, E.TensorDesc((b.shape[2],), out_dt)) if bias else None
        m, n = a.shape[0], b.shape[2]
        layout = ir.FixedLayout(torch.device("cuda", 0), out_dt, [m, n], [n, 1])
        _, nonzero = _is_static_problem(layout)
        want = bool(GM.use_flydsl_grouped_mm_template(na, nb, layout, True, False, no, nbias, nonzero, scaled)
                    and GM.get_flydsl_grouped_mm_template_kwargs(na, nb))
    conds = GGF.grouped_mm_rules(a, b, offs or None, bias=bias, scaled=scaled, out_dtype=odt,
                               autotuning=autotune, search_space=space)
    assert _call_ok(conds) == want, (case, [c.detail for c in conds if c.ok is False])


#: (A, B, FlyDSL offered): grouped operands with no unit stride, which grouped_mm_args copies.
_GNOUNIT = [
    (E.TensorDesc((128, 128), _BF, (512, 4), 3), E.TensorDesc((4, 128, 256), _BF), True),
    (E.TensorDesc((128, 128), _BF), E.TensorDesc((4, 128, 256), _BF, (65536, 512, 2), 1), True),
    (E.TensorDesc((128, 128), _BF, (512, 4), 3), E.TensorDesc((4, 128, 96), _BF, (24576, 192, 2)), False),  # N % 128
    (E.TensorDesc((128, 96), _BF, (384, 4), 3), E.TensorDesc((4, 96, 256), _BF, (1, 4, 384)), False),  # B [G, N, K]
]


@pytest.mark.parametrize("a,b,offered", _GNOUNIT, ids=[f"{a.text()}x{b.text()}" for a, b, _ in _GNOUNIT])
def test_grouped_operand_without_unit_stride_is_judged_as_copy(gfx950, fake_mode, a, b, offered):
    """As for dense mm: _tuned_grouped_mm_common's grouped_mm_args realizes A and B with
    realize_inputs -> require_stride1; torch's entry point (tuned_grouped_mm, FlyDSL choices
    recorded) and the rules agree."""
    import torch._inductor.kernel.mm_grouped as GM
    from torch._inductor.codegen.flydsl.flydsl_template import FlyDSLTemplate

    offers = []
    with inductor_harness(flydsl_enable_autotuning=False) as g, \
            mock.patch.object(FlyDSLTemplate, "maybe_append_choice", lambda *a_, **k: offers.append(k)), \
            mock.patch.object(GM, "autotune_select_algorithm", lambda *a_, **k: (None, None)):
        GM.tuned_grouped_mm(_ir_input(g, fake_mode, a), _ir_input(g, fake_mode, b),
                            _ir_input(g, fake_mode, E.TensorDesc((b.shape[0],), torch.int32)))
    assert bool(offers) == offered
    conds = GGF.grouped_mm_rules(a, b, True)
    assert _call_ok(conds) == offered, [c.detail for c in conds if c.ok is False]
    copied = [c for c in conds if "copied" in c.name]
    assert len(copied) == (1 not in a.stride) + (1 not in b.stride)
    assert all(c.ok and "grouped_mm_args" in c.source and "require_stride1" in c.source for c in copied)


def test_grouped_published_uniform_cases(gfx950, fake_mode):
    """The published uniform grouped cases (label g{G}x{M}x{N}x{K}) qualify by torch and by us."""
    import csv

    import torch._inductor.kernel.mm_grouped as GM
    from torch._inductor import ir

    from flyexplore.paths import published_dir

    rows = [r for r in csv.DictReader(open(published_dir() / "grouped_gemm_bf16.csv"))
            if r["case"].startswith("g") and r["case"].count("x") == 3]
    assert rows
    with inductor_harness() as g:
        for r in rows:
            gg, m, n, k = (int(v) for v in r["case"][1:].split("x"))
            a, b = E.TensorDesc((gg * m, k), torch.bfloat16), E.TensorDesc((gg, k, n), torch.bfloat16)
            layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [gg * m, n], [n, 1])
            na, nb = _ir_input(g, fake_mode, a), _ir_input(g, fake_mode, b)
            no = _ir_input(g, fake_mode, E.TensorDesc((gg,), torch.int32))
            assert GM.use_flydsl_grouped_mm_template(na, nb, layout, True, False, no, None, True, False)
            assert GM.get_flydsl_grouped_mm_template_kwargs(na, nb)
            assert _call_ok(GGF.grouped_mm_rules(a, b, True))


# -- MXFP scaled mm -------------------------------------------------------------------------

_FP8, _FP4, _E8 = torch.float8_e4m3fn, torch.float4_e2m1fn_x2, torch.float8_e8m0fnu


_MX_IN = [(32, 4096, 4096), (1, 8, 128), (100, 14336, 256), (4096, 4096, 4096), (16, 104, 384)]
_MX_MUT = ["dims", "k_odd", "n_odd", "a_pad", "a_pad_odd", "a_col", "b_pad", "b_pad_odd", "b_row", "a_off",
           "a_off16", "b_off", "sa_off", "sa_off16", "dtype_b", "scale_dtype", "scale_rows", "out_fp32", "out_none",
           "out_fp16", "recipe", "recipe_16", "swizzle", "bias", "bias_dtype", "bias_len", "fast", "cdim", "levels"]


@st.composite
def mxfp_cases(draw):
    """An eligible MXFP8 / MXFP4 scaled mm (A row-major, B column-major, bf16 out), then none
    or one change."""
    mut = draw(st.sampled_from([None] * len(_MX_MUT) + _MX_MUT))
    fmt = draw(st.sampled_from(["mxfp8", "mxfp4"]))
    dt, epb = (_FP8, 1) if fmt == "mxfp8" else (_FP4, 2)
    m, n, k = draw(st.sampled_from(_MX_IN))
    if mut == "dims":
        m = draw(st.sampled_from([1, 16, 100, 4096]))
        n = draw(st.sampled_from([8, 32, 100, 4100, 14336]))
        k = draw(st.sampled_from([64, 128, 192, 384, 4160]))
    k = 4160 if mut == "k_odd" else k
    n = 4100 if mut == "n_odd" else n
    ks = k // epb
    a_stride = {"a_pad": (ks + 16, 1), "a_pad_odd": (ks + 8 + epb, 1), "a_col": (1, m)}.get(mut, (ks, 1))
    b_stride = {"b_pad": (1, ks + 16), "b_pad_odd": (1, ks + 8 + epb), "b_row": (n, 1)}.get(mut, (1, ks))
    dtb = (_FP4 if dt == _FP8 else _FP8) if mut == "dtype_b" else dt
    a = E.TensorDesc((m, ks), dt, a_stride, {"a_off": 5, "a_off16": 16}.get(mut, 0))
    b = E.TensorDesc((ks, n), dtb, b_stride, 3 if mut == "b_off" else 0)
    sdt = torch.float32 if mut == "scale_dtype" else _E8
    sa = E.TensorDesc((m, k // 32), sdt, None, {"sa_off": 5, "sa_off16": 16}.get(mut, 0))
    sb = E.TensorDesc((n + (mut == "scale_rows"), k // 32), _E8, None, 0)
    out = {"out_fp32": torch.float32, "out_none": None, "out_fp16": torch.float16}.get(mut, torch.bfloat16)
    recipe = {"recipe": "rowwise", "recipe_16": "blockwise1x16"}.get(mut, "blockwise1x32")
    swz = "swizzle_32_4_4" if mut == "swizzle" else "none"
    bias = {"bias": "ok", "bias_dtype": "dtype", "bias_len": "len"}.get(mut)
    cdim = [1] if mut == "cdim" else None
    return (a, b, sa, sb, out, recipe, swz, bias, mut == "fast", cdim, 2 if mut == "levels" else 1, draw(st.booleans()),
            draw(st.sampled_from(["DEFAULT", "DEFAULT", "EXHAUSTIVE"])))


@SETTINGS
@given(mxfp_cases())
@pytest.mark.slow
def test_mxfp_agrees_with_torch(gfx950, fake_mode, case):
    import torch._inductor.kernel.mm as MM
    from torch._inductor import ir

    a, b, sa, sb, out, recipe, swz, bias_kind, fast, cdim, levels, autotune, space = case
    n = b.shape[1]
    bias = None
    if bias_kind:
        bdt = out if bias_kind != "dtype" else torch.float32
        bias = E.TensorDesc((n + (bias_kind == "len"),), bdt or torch.bfloat16)
    with inductor_harness(flydsl_enable_autotuning=autotune, max_autotune_gemm_search_space=space) as g:
        na, nb = _ir_input(g, fake_mode, a), _ir_input(g, fake_mode, b)
        nsa, nsb = _ir_input(g, fake_mode, sa), _ir_input(g, fake_mode, sb)
        nbias = _ir_input(g, fake_mode, bias) if bias is not None else None
        # scaled_mm_v2_constraint's stride rule, applied with torch's own require_exact_strides
        if a.stride[1] != 1:
            na = ir.ExternKernel.require_exact_strides(na, (a.shape[1], 1))
        if b.stride[0] != 1:
            nb = ir.ExternKernel.require_exact_strides(nb, (1, b.shape[0]))
        rec, sw = SF.RECIPES[recipe], SF.SWIZZLES[swz]
        scales_a, scales_b = [nsa] * levels, [nsb] * levels
        fmt = MM._get_rocm_mxfp_v2_format(na, nb, scales_a, [rec] * levels, [sw] * levels, scales_b,
                                          [rec] * levels, [sw] * levels, nbias, out, cdim, fast)
        want = False
        if fmt is not None:
            layout = ir.FixedLayout(torch.device("cuda", 0), out, [a.shape[0], n])
            want = len(MM.get_flydsl_mxfp_template_kwargs(fmt, layout, na, nb, nsa, nsb, nbias)) > 0
    conds = SF.scaled_mm_rules(a, b, sa, sb, recipe_a=recipe, recipe_b=recipe, swizzle_a=swz, swizzle_b=swz,
                              out_dtype=out, bias=bias, use_fast_accum=fast, contraction_dim=cdim,
                              scale_levels=levels, autotuning=autotune, search_space=space)
    assert _call_ok(conds) == want, (case, [c.detail for c in conds if c.ok is False])


def test_mxfp_published_shapes_eligible(gfx950, fake_mode):
    """The published MXFP8/MXFP4 shapes (NT, bf16 output) qualify by torch and by us."""
    import csv

    import torch._inductor.kernel.mm as MM
    from torch._inductor import ir

    from flyexplore.paths import published_dir

    rows = list(csv.DictReader(open(published_dir() / "mxfp_gemm.csv")))
    assert len(rows) == 34
    with inductor_harness() as g:
        for r in rows:
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            dt, epb = (_FP8, 1) if r["format"] == "mxfp8" else (_FP4, 2)
            a, b = E.TensorDesc((m, k // epb), dt), E.TensorDesc((k // epb, n), dt, (1, k // epb))
            sa, sb = E.TensorDesc((m, k // 32), _E8), E.TensorDesc((n, k // 32), _E8)
            na, nb, nsa, nsb = (_ir_input(g, fake_mode, t) for t in (a, b, sa, sb))
            fmt = MM._get_rocm_mxfp_v2_format(na, nb, [nsa], [3], [0], [nsb], [3], [0], None, torch.bfloat16, None, False)
            assert fmt == r["format"]
            layout = ir.FixedLayout(torch.device("cuda", 0), torch.bfloat16, [m, n])
            assert MM.get_flydsl_mxfp_template_kwargs(fmt, layout, na, nb, nsa, nsb, None)
            assert _call_ok(SF.scaled_mm_rules(a, b, sa, sb))


# -- the eager arch lookup ------------------------------------------------------------------

@pytest.mark.parametrize("environ,device", [
    ({"FLYDSL_GPU_ARCH": "gfx950"}, None), ({"FLYDSL_GPU_ARCH": "gfx942:sramecc+"}, "gfx950"),
    ({"HSA_OVERRIDE_GFX_VERSION": "9.5.0"}, None), ({"HSA_OVERRIDE_GFX_VERSION": "9.4.2"}, "gfx950"),
    ({"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}, None), ({"HSA_OVERRIDE_GFX_VERSION": "gfx950"}, None),
    ({"HSA_OVERRIDE_GFX_VERSION": "9.5"}, "gfx942"), ({"HSA_OVERRIDE_GFX_VERSION": "9.5.x"}, "gfx950"),
    ({}, "gfx950"), ({}, None)])
def test_eager_arch_lookup_agrees_with_torch(environ, device):
    from torch._native import flydsl_utils as fu

    with pytest.MonkeyPatch.context() as mp:
        for k in ("FLYDSL_GPU_ARCH", "HSA_OVERRIDE_GFX_VERSION"):
            mp.delenv(k, raising=False)
        for k, v in environ.items():
            mp.setenv(k, v)
        _clear_arch_caches()
        mp.setattr(fu, "_get_flydsl_device_arch", lambda idx: device)
        want = fu._resolve_rocm_arch(0)
    _clear_arch_caches()
    assert E.torch_eager_arch(environ, device)[0] == want


# -- the environment: flydsl version, _mlir runtime, arch -----------------------------------
#
# A fake flydsl is really installed in a temporary folder (a package, optionally its _mlir
# runtime, optionally distribution metadata) with site-packages taken off sys.path, so torch's
# own checks and flyexplore's read the same files through importlib; torch runs as a ROCm
# build (torch.version.hip set) and its per-process caches are cleared around each case.

_VERSIONS = ["0.3.0", "0.3.4", "0.3.0.dev1", "0.3.0rc1", "0.3.0c1", "0.3.0pre1", "0.3.4+g5a1b2c3",
             "0.3.4.post1", "0.4.0", "0.2.9", "banana", None, "absent"]   # None: no metadata; absent: no package


def _clear_runtime_caches():
    from torch._native import common_utils as cu
    from torch._native import flydsl_utils as fu
    from torch._inductor.codegen.flydsl import flydsl_utils as ifu
    for fn in (fu._check_runtime_available, fu._version_is_ok, cu.check_native_version_skip,
               cu.check_native_jit_disabled, ifu._check_runtime_available):
        fn.cache_clear()


@contextlib.contextmanager
def fake_flydsl(root, version, mlir=True, environ=None):
    """flydsl ``version`` (None: without metadata; "absent": not installed) under ``root``, the
    only one importlib can find; ``environ`` set in os.environ; torch a ROCm build."""
    import importlib
    import os
    import sys

    root.mkdir(parents=True, exist_ok=True)
    if version != "absent":
        pkg = root / "flydsl"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        if mlir:
            (pkg / "_mlir").mkdir()
            (pkg / "_mlir" / "__init__.py").write_text("")
        if version is not None:
            meta = root / f"flydsl-{version}.dist-info"
            meta.mkdir()
            (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flydsl\nVersion: {version}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "path", [str(root)] + [p for p in sys.path if "site-packages" not in p])
        for name in [m for m in sys.modules if m == "flydsl" or m.startswith("flydsl.")]:
            mp.delitem(sys.modules, name)
        for k in ("TORCH_NATIVE_SKIP_VERSION_CHECK", "TORCH_DISABLE_NATIVE_JIT"):
            mp.delenv(k, raising=False)
        for k, v in (environ or {}).items():
            mp.setenv(k, v)
        mp.setattr(torch.version, "hip", "7.0.0")
        importlib.invalidate_caches()
        _clear_runtime_caches()
        try:
            yield dict(os.environ)
        finally:
            _clear_runtime_caches()
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def assumed_facts():
    from flyexplore.world.facts import facts
    return facts(assume_rocm=True)     # before any fake install: collect() caches what it sees


def _all_of(conds: dict, *names) -> bool:
    """All of ``names`` that are present hold (the eager verdict shows either "installed" failed
    or the version check); at least one is present."""
    assert any(n in conds for n in names), conds
    return all(conds[n] for n in names if n in conds)


@pytest.mark.parametrize("mlir", [True, False], ids=["built", "no_mlir"])
@pytest.mark.parametrize("version", _VERSIONS, ids=[str(v) for v in _VERSIONS])
def test_flydsl_readiness_agrees_with_torch(tmp_path, version, mlir, assumed_facts):
    """Eager: torch registers overrides iff ``_check_runtime_available()[0] and
    _version_is_ok()`` (``register_op_override``); compile: ``_flydsl_runtime_unavailable_reason()
    is None``. The readiness rules, the explainer's conditions and ``flyexplore env`` (which also
    decides the sweep's flydsl backends) all give torch's answer."""
    import dataclasses

    from torch._inductor.codegen.flydsl import flydsl_utils as ifu
    from torch._native import flydsl_utils as fu

    from flyexplore.world import env as ENV
    from flyexplore.world import readiness as R

    for i, skip in enumerate((None, "1", "0")):
        environ = {} if skip is None else {"TORCH_NATIVE_SKIP_VERSION_CHECK": skip}
        with fake_flydsl(tmp_path / str(i), version, mlir, environ) as env_now:
            eager_torch = fu._check_runtime_available()[0] and fu._version_is_ok()
            compile_torch = ifu._flydsl_runtime_unavailable_reason() is None
            v, built = R.flydsl_version(), R.flydsl_built()
            assert built == (mlir and version != "absent")
            assert (R.flydsl_installed(v).ok and R.eager_flydsl_version(v, env_now).ok) == eager_torch, (v, skip)
            assert R.compile_flydsl_runtime(v, built).ok == compile_torch, v
            f = dataclasses.replace(assumed_facts, flydsl_version=None if v == R.NOT_INSTALLED else v,
                                    flydsl_built=built, environ=env_now)
            eager_c = {c.name: c.ok for c in R.eager_environment(f, "rmsnorm")}
            assert _all_of(eager_c, "flydsl installed", "flydsl version") == eager_torch
            comp_c = {c.name: c.ok for c in R.compile_environment(f)}
            assert comp_c["flydsl runtime"] == compile_torch
            if skip is None:
                e = ENV.collect(environ=env_now)
                assert e.versions["flydsl"] == v
                by = {c.name: c.ok for c in e.flydsl_eager.checks + e.flydsl_compile.checks}
                assert _all_of(by, "flydsl installed", "flydsl version accepted") == eager_torch
                assert by["flydsl runtime available"] == compile_torch


def test_prereleases_and_local_builds_are_told_apart(tmp_path):
    """What the issue found: torch's eager check refuses 0.3 pre-releases and accepts local
    builds; Inductor takes both; missing metadata is not 'not installed'."""
    from flyexplore.world import env as ENV
    from flyexplore.world import readiness as R

    for v in ("0.3.0.dev1", "0.3.0rc1", "0.3.0c1", "0.3.0pre1"):
        r = R.eager_flydsl_version(v, {})
        assert not r.ok and "pre-release" in r.detail and R.is_prerelease(v)
        assert R.compile_flydsl_runtime(v, True).ok
    assert R.eager_flydsl_version("0.3.4+g5a1b2c3", {}).ok and R.version_tuple("0.3.4+g5a1b2c3") == (0, 3)
    with fake_flydsl(tmp_path, None) as environ:
        assert R.flydsl_version() == R.NO_METADATA
        e = ENV.collect(environ=environ)
    assert e.versions["flydsl"] == R.NO_METADATA
    eager = {c.name: c for c in e.flydsl_eager.checks}
    assert "flydsl installed" not in eager and "version metadata" in eager["flydsl version accepted"].detail
    comp = {c.name: c for c in e.flydsl_compile.checks}
    assert "missing or invalid FlyDSL version metadata" in comp["flydsl runtime available"].detail
    assert "version metadata" in e.to_text() and "flydsl: installed, no version metadata" in e.to_text()


_ARCH_VALUES = ["gfx950", "gfx950:sramecc+", "9.5.0", "9.4.2", "11.0.0", "junk", "9.5", "9.5.x", "gfx942:xnack-", ""]


class _Props:
    def __init__(self, arch):
        self.gcnArchName = arch


@pytest.mark.parametrize("device", [None, "gfx950:sramecc+:xnack-", "gfx942"])
@pytest.mark.parametrize("var", ["FLYDSL_GPU_ARCH", "HSA_OVERRIDE_GFX_VERSION", "both"])
@pytest.mark.parametrize("value", _ARCH_VALUES)
def test_arch_resolvers_agree_with_torch(var, value, device):
    """The one arch resolver against torch's: eager ``_resolve_rocm_arch`` /
    ``_is_supported_arch(("gfx950",))`` and Inductor's ``_get_flydsl_device_arch`` (which reads
    the device only), on a device whose gcnArchName is ``device`` (torch.cuda faked)."""
    import torch._inductor.codegen.flydsl.flydsl_scheduling as ifs
    from torch._native import flydsl_utils as fu

    from flyexplore.world import env as ENV
    from flyexplore.world import readiness as R

    environ = ({"FLYDSL_GPU_ARCH": value, "HSA_OVERRIDE_GFX_VERSION": "9.4.2"} if var == "both"
               else {var: value})
    with pytest.MonkeyPatch.context() as mp:
        for k in ("FLYDSL_GPU_ARCH", "HSA_OVERRIDE_GFX_VERSION"):
            mp.delenv(k, raising=False)
        for k, v in environ.items():
            mp.setenv(k, v)
        mp.setattr(torch.cuda, "is_available", lambda: device is not None)
        mp.setattr(torch.cuda, "get_device_properties", lambda idx: _Props(device))
        _clear_arch_caches()
        ifs._get_flydsl_device_arch.cache_clear()
        want = fu._resolve_rocm_arch(0)
        want_ok = fu._is_supported_arch(0, ("gfx950",))
        want_compile = ifs._get_flydsl_device_arch(0) == "gfx950"
    _clear_arch_caches()
    ifs._get_flydsl_device_arch.cache_clear()
    assert R.torch_eager_arch(environ, device)[0] == want
    assert R.eager_arch(environ, device).ok == want_ok
    assert R.compile_arch(device, environ).ok == want_compile
    devs = (ENV.Device(0, "MI", device.split(":")[0], 256, 0),) if device else ()
    assert ENV.resolve_target_arch(devs, "rocm" if device else "cpu", environ)[0] == want

"""What really ran: the kernel classifier (real kernel names), traces on the CPU with the real
profiler, autotune capture from a real Inductor max-autotune on the CPU, and sweep rows that
asked for FlyDSL but ran something else."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from flyexplore.results import table as R  # noqa: E402
from flyexplore.insight import autotune as AU  # noqa: E402
from flyexplore.insight import case_trace as CT  # noqa: E402
from flyexplore.insight import kernels as K  # noqa: E402
from flyexplore.insight import trace as T  # noqa: E402

#: Real CUDA kernel names from torch.profiler on an NVIDIA H200 (torch 2.11.0+cu130), as a lent-GPU
#: probe recorded them (data/h200/trace/kernels.csv holds more), with the family each belongs to.
H200_NAMES = {
    "Memset (Device)": ("runtime", "memset/memcpy"),
    "at::native::mbtopk::computeDigitCumSum(short*, unsigned int*, unsigned int)": ("ATen native", "ATen"),
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0":
        ("attention", "cuDNN SDPA"),
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": ("vendor BLAS", "cuBLAS (nvjet)"),
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, float, "
    "c10::BFloat16 const*, c10::BFlo": ("ATen native", "ATen"),
    "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::GTOp<float, true>, unsigned int>"
    "(at::cuda::detail::TensorInfo<": ("ATen native", "ATen"),
    "void at::native::mbtopk::computeBlockDigitCounts<float, unsigned int, unsigned int, 2>(at::cuda::detail::"
    "TensorInfo<float const, unsigned in": ("ATen native", "ATen"),
    "void at::native::mbtopk::gatherTopK<float, unsigned int, 2>(at::cuda::detail::TensorInfo<float const, "
    "unsigned int>, unsigned int, unsigned ": ("ATen native", "ATen"),
    "void at_cuda_detail::cub::detail::scan_by_key::DeviceScanByKeyKernel<at_cuda_detail::cub::detail::"
    "scan_by_key::policy_hub<thrust::THRUST_300": ("ATen native", "ATen (CUB)"),
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<128, 12": ("attention", "flash-attention (ATen pytorch_flash)"),
}


@pytest.mark.parametrize("name", sorted(H200_NAMES))
def test_classifier_on_real_h200_kernel_names(name):
    c = K.classify(name)
    assert (c.family, c.library) == H200_NAMES[name]
    assert c.rule


@pytest.mark.parametrize("name,family", [
    ("rmsnorm_kernel_0", "FlyDSL"), ("register_topk_kernel_0", "FlyDSL"), ("radix_select_topk_kernel_3", "FlyDSL"),
    ("gemm_gfx950_kernel_0", "FlyDSL"), ("gemm_hti_gfx950_grouped_kernel_0", "FlyDSL"),
    ("triton_tem_fused_mm_0", "Triton/Inductor"), ("triton_poi_fused_add_0", "Triton/Inductor"),
    ("triton_red_fused__fused_rms_norm_0", "Triton/Inductor"),
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1_SN_1LDSB1_GRVW8", "vendor BLAS"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "vendor BLAS"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "vendor BLAS"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "vendor BLAS"),
    ("void ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<...>>(...)", "CK"),
    ("attn_fwd", "AOTriton"), ("bwd_kernel_dk_dv", "AOTriton"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    # never guessed: plausible but unknown names stay unclassified
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, ...)", "unclassified"),
    ("my_custom_kernel", "unclassified"), ("kernel_fwd_0", "unclassified"), ("gemm_kernel", "unclassified"),
])
def test_classifier_rules(name, family):
    assert K.classify(name).family == family


def test_flydsl_rules_cover_every_flydsl_kernel_in_the_installed_torch():
    """Every @flyc.kernel function torch 2.15 defines for an op we cover is recognised, under
    the symbol flyc gives it (<function>_<id>)."""
    root = Path(torch.__file__).parent
    files = [root / "_native/ops/norm/flydsl_rmsnorm_fwd.py", root / "_native/ops/topk/flydsl_kernels.py",
             root / "_inductor/kernel/vendored_templates/flydsl/kernels/gemm_gfx950.py",
             root / "_inductor/kernel/vendored_templates/flydsl/kernels/grouped_gemm_gfx950.py"]
    names = set()
    for f in files:
        names |= set(re.findall(r"@flyc\.kernel(?:\([^)]*\))?\s*\n\s*def (\w+)\(", f.read_text()))
    assert len(names) >= 7, names
    for n in names:
        assert K.classify(f"{n}_0").family == "FlyDSL", n


def test_a_family_registered_at_run_time_is_classified():
    """trace.py knows no FlyDSL kernel name itself: a family added with register_op is
    classified by its KernelPattern, and forgotten once it is unregistered."""
    from flyexplore.ops import FlyDSLPath, KernelPattern, Operator, register_op, unregister_op

    toy = Operator(name="toy_trace_op", doc="toy", dims=("n",), options={}, dtypes=("fp32",),
                   flydsl=FlyDSLPath(route="eager", path="toy path for the trace test", aten_ops=("toy_trace_op",),
                                     kernels=(KernelPattern(r"^toy_kernel(_\d+)?$", "FlyDSL toy", "toy rule"),)))
    toy.make_inputs = toy.reference = toy.error = lambda *a: None
    toy.backend("aten", "toy")(lambda case, dtype, inputs, ctx: (lambda: None))
    assert K.classify("toy_kernel_3").family == "unclassified"
    register_op(toy)
    try:
        c = K.classify("void toy_kernel_3<float>(float*)")
        assert (c.family, c.library, c.rule) == ("FlyDSL", "FlyDSL toy", "toy rule")
        assert K.classify("toy_kernelx").family == "unclassified"
        tr = T.from_kernels([["toy_kernel_0", 1, 5.0], ["triton_poi_fused_add_0", 1, 1.0]])
        assert tr.flydsl_taken is True and tr.observed == "FlyDSL,Triton/Inductor"
        assert K.classify("rmsnorm_kernel_0").library.startswith("FlyDSL RMSNorm")  # built-ins still there
    finally:
        unregister_op("toy_trace_op")
    assert K.classify("toy_kernel_3").family == "unclassified"


def test_flydsl_patterns_are_the_registrys():
    from flyexplore.ops import flydsl_ops, get_op

    pats = K.flydsl_kernel_patterns()
    assert pats == tuple(k for n in flydsl_ops() for k in get_op(n).flydsl.kernels)
    assert {p.regex for p in pats} >= {r"^rmsnorm_kernel(_\d+)?$", r"^gemm_gfx950_grouped_kernel(_\d+)?$"}
    assert not hasattr(T, "_FLYDSL_KERNELS")


def _relative_imports(module) -> set[str]:
    """The leaf names of every flyexplore module a module's source imports, at any depth
    (``from flyexplore.run.cases import x`` and ``from flyexplore.run import cases`` -> ``cases``)."""
    import ast
    import importlib.util
    import inspect

    out = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flyexplore"):
            out.add(node.module.split(".")[-1])
            for a in node.names:  # a module imported from its package
                if importlib.util.find_spec(f"{node.module}.{a.name}") if importlib.util.find_spec(node.module).submodule_search_locations else False:
                    out.add(a.name)
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[-1] for a in node.names if a.name.startswith("flyexplore.")}
    return out


def test_trace_does_not_import_the_sweep():
    """A sweep's cases import the trace; the trace (and the modules it imports) never the sweep
    or its cases (tests/test_layout.py checks the whole package for cycles)."""
    import flyexplore.insight.autotune as A
    import flyexplore.measure.devstate as D
    import flyexplore.run.build as BD
    import flyexplore.run.cases as C
    import flyexplore.run.sweep as S

    for mod in (T, K, CT, A, D, BD):
        assert not {"sweep", "cases"} & _relative_imports(mod), mod.__name__
    # the build steps (shared with an environment A/B's worker) import the trace; cases import them
    assert "trace" in _relative_imports(BD) and "build" in _relative_imports(C) and "cases" in _relative_imports(S)


def test_kernel_head():
    assert K.kernel_head("void at::native::foo<float>(int)") == "at::native::foo"
    assert K.kernel_head("nvjet_sm90_x") == "nvjet_sm90_x"


def test_trace_on_cpu_lists_cpu_ops_and_says_so():
    x, w = torch.randn(64, 256), torch.randn(256)
    tr = T.trace(lambda: torch.nn.functional.rms_norm(x, (256,), w, 1e-6), device="cpu", reps=2)
    assert tr.device == "cpu" and tr.kernels == ()
    names = [k.name for k in tr.cpu_ops]
    assert "aten::rms_norm" in names
    assert all(k.where == "cpu" for k in tr.cpu_ops)
    assert tr.observed == "CPU: ATen native"
    assert tr.flydsl_taken is False                     # FlyDSL is GPU-only
    assert any("no device kernels" in n for n in tr.notes)
    df = tr.to_frame()
    assert list(df.columns) == ["name", "family", "library", "calls", "us", "where"]
    assert (df["calls"] > 0).all() and (df["us"] >= 0).all()
    json.dumps(tr.to_dict())


def test_trace_of_a_compiled_call_on_cpu():
    torch._dynamo.reset()
    f = torch.compile(lambda a: torch.relu(a) + 1, dynamic=False)
    a = torch.randn(32, 32)
    tr = T.trace(lambda: f(a), device="cpu", reps=1)
    fams = {k.family for k in tr.cpu_ops}
    assert "Triton/Inductor" in fams, tr.cpu_ops
    assert any(k.library == "Inductor compiled graph" for k in tr.cpu_ops)


def test_autotune_capture_from_a_real_cpu_max_autotune(capfd):
    """Inductor's CPU max-autotune of bmm benchmarks ATen against its C++ template: the hook
    sees every candidate and its time, the stderr AUTOTUNE table says the same, and the hook
    is removed afterwards."""
    from torch._inductor import select_algorithm as sa

    torch._dynamo.reset()
    # Caches off: a graph served from Inductor's FX graph cache is not lowered again, so
    # nothing would be autotuned (and nothing captured).
    f = torch.compile(torch.bmm, dynamic=False,
                      options={"max_autotune": True, "max_autotune_gemm_backends": "ATEN,CPP",
                               "fx_graph_cache": False, "autotune_local_cache": False})
    a, b = torch.randn(2, 32, 48), torch.randn(2, 48, 16)
    with AU.capture_autotune() as got:
        f(a, b)
    err = capfd.readouterr().err
    assert got, "no autotune decision captured"
    d = got[0]
    assert d.op == "bmm" and d.source == "feedback_saver"
    fams = {c.family for c in d.candidates}
    assert {"ATen", "C++ template"} <= fams
    assert d.winner is not None and d.winner.time_ms == min(c.time_ms for c in d.candidates)
    assert all(c.time_ms > 0 for c in d.candidates)
    parsed = AU.parse_autotune_tables(err)
    assert parsed and parsed[0].op == "bmm"
    assert {c.name for c in parsed[0].candidates} == {c.name for c in d.candidates}
    assert parsed[0].winner.name == d.winner.name
    fns = getattr(AU._selector_cache(sa), "feedback_saver_fns", [])
    assert all(getattr(fn, "__qualname__", "") != "capture_autotune.<locals>.hook" for fn in fns)


def test_stderr_fallback_when_the_hook_is_missing(monkeypatch, capsys):
    from torch._inductor import select_algorithm as sa

    monkeypatch.delattr(sa, "add_feedback_saver")
    table = ("AUTOTUNE mm(16x4096, 4096x28672)\nstrides: [4096, 1], [1, 4096]\ndtypes: torch.bfloat16, torch.bfloat16\n"
             "  triton_mm_7 0.0571 ms 100.0% ACC_TYPE='tl.float32', BLOCK_K=128\n"
             "  mm 0.0600 ms 95.2% \n  flydsl_mm_flydsl_0 0.0700 ms 81.6% FlyDSL template\n"
             "  flydsl_mm_flydsl_1 inf ms 0.0% \nSingleProcess AUTOTUNE benchmarking takes 3.2 seconds\n")
    import sys
    with AU.capture_autotune() as got:
        sys.stderr.write(table)
    assert len(got) == 1 and got[0].source == "stderr"
    d = got[0]
    assert d.winner.name == "triton_mm_7" and d.winner_family == "Triton/Inductor"
    assert d.best_of("FlyDSL").name == "flydsl_mm_flydsl_0"
    assert math.isinf([c for c in d.candidates if c.name == "flydsl_mm_flydsl_1"][0].time_ms)
    assert "best FlyDSL flydsl_mm_flydsl_0" in d.summary() and "1.23x slower" in d.summary()


def test_from_kernels_reuses_the_timer_column():
    col = json.dumps([["gemm_gfx950_kernel_0", 1.0, 180.5], ["void at::native::vectorized_elementwise_kernel<4>()", 1.0, 2.0]])
    tr = T.from_kernels(col)
    assert tr.flydsl_taken is True and tr.families == ("FlyDSL", "ATen native")
    assert tr.observed == "FlyDSL,ATen native"
    none = T.from_kernels([["Cijk_Alik_Bljk_BBS_BH_MT128", 1.0, 50.0]])
    assert none.flydsl_taken is False
    assert T.Trace((), (), (), "cuda").flydsl_taken is None
    unknown = T.from_kernels([["Cijk_Alik_Bljk_BBS_BH_MT128", 1.0, 50.0], ["some_new_kernel_0", 1.0, 5.0]])
    assert unknown.flydsl_taken is None and unknown.unclassified == ("some_new_kernel_0",)


def test_row_columns_on_a_miss_gives_the_reason():
    from flyexplore.ops import get_op

    op = get_op("gemm")
    case = op.case("16x28672x4096:NT")
    lost = AU.AutotuneDecision("mm", (AU.Candidate("triton_mm_3", "Triton/Inductor", 0.05),
                                     AU.Candidate("flydsl_mm_flydsl_0", "FlyDSL", 0.06)), "feedback_saver")
    tr = T.Trace((T.TracedKernel("triton_tem_fused_mm_0", "Triton/Inductor", "Triton", 1, 50.0),), (), (lost,), "cuda")
    cols = CT.trace_columns(tr, "flydsl", "gemm", case, "bf16")
    assert cols["flydsl_taken"] is False
    assert "lost the autotune" in cols["flydsl_reason"] and "triton_mm_3" in cols["flydsl_reason"]
    assert json.loads(cols["autotune"])[0]["winner_family"] == "Triton/Inductor"
    # no autotune record: the explainer's reason (here: this machine is no ROCm gfx950)
    tr2 = T.Trace((T.TracedKernel("nvjet_sm90_x", "vendor BLAS", "cuBLAS", 1, 50.0),), (), (), "cuda")
    cols2 = CT.trace_columns(tr2, "flydsl", "gemm", case, "bf16")
    assert cols2["flydsl_taken"] is False and "not a ROCm build" in cols2["flydsl_reason"]
    ok = CT.trace_columns(T.from_kernels([["gemm_gfx950_kernel_0", 1, 1.0]]), "flydsl", "gemm", case, "bf16")
    assert ok["flydsl_taken"] is True and ok["flydsl_reason"].startswith("taken: FlyDSL kernels gemm_gfx950_kernel_0")
    assert "flydsl_taken" not in CT.trace_columns(tr, "aten", "gemm", case, "bf16")
    won = AU.AutotuneDecision("mm", (AU.Candidate("flydsl_mm_flydsl_0", "FlyDSL", 0.04),), "feedback_saver")
    odd = T.Trace((T.TracedKernel("gemm_variant_x", "unclassified", "", 1, 40.0),), (), (won,), "cuda")
    cols3 = CT.trace_columns(odd, "flydsl", "gemm", case, "bf16")
    assert cols3["flydsl_taken"] is None and "unclassified: gemm_variant_x" in cols3["flydsl_reason"]
    assert "autotune picked FlyDSL" in cols3["flydsl_reason"]


def _cpu_flydsl_rmsnorm():
    """The catalogue's RMSNorm with its flydsl backend made available on the CPU: torch
    routes the call to ATen, which is exactly a FlyDSL miss."""
    import dataclasses

    from flyexplore.ops import get_op

    rms = get_op("rmsnorm")
    fly = rms.backends["flydsl"]
    backends = dict(rms.backends)
    backends["flydsl"] = dataclasses.replace(fly, available=lambda ctx, case, dtype: None)
    return dataclasses.replace(rms, backends=backends)


def test_sweep_records_a_flydsl_miss_and_speedup_leaves_it_out(tmp_path):
    import flyexplore as fx

    op = _cpu_flydsl_rmsnorm()
    df = fx.sweep(op, shapes="64x1024", dtypes="fp32", backends="aten,flydsl", out=tmp_path / "r.parquet",
                  timer={"rep": 3, "warmup": 1}, progress=False, trace=True)
    R.validate(df)
    fly = df[df["backend"] == "flydsl"].iloc[0]
    assert fly["status"] == "ok" and fly["time_ms"] > 0
    assert fly["flydsl_taken"] == False  # noqa: E712  (pandas boolean)
    assert fly["observed"] == "CPU: ATen native"
    assert "not taken" in fly["flydsl_reason"] and "ROCm" in fly["flydsl_reason"]
    assert "FlyDSL requested but not taken" in fly["message"]
    aten = df[df["backend"] == "aten"].iloc[0]
    assert aten["observed"] == "CPU: ATen native" and R.normalize(df)["flydsl_taken"].isna().iloc[0]
    assert R.speedup(df).empty and R.geomean_speedup(df).empty
    back = R.load(tmp_path / "r.parquet")
    assert back.loc[back["backend"] == "flydsl", "flydsl_taken"].iloc[0] == False  # noqa: E712
    csv = R.save(df, tmp_path / "r.csv")
    assert R.load(csv).loc[lambda d: d["backend"] == "flydsl", "flydsl_taken"].iloc[0] == False  # noqa: E712


def test_flydsl_rows_are_traced_even_without_trace_flag(tmp_path):
    import pandas as pd

    import flyexplore as fx

    df = fx.sweep(_cpu_flydsl_rmsnorm(), shapes="64x1024", dtypes="fp32", backends="aten,flydsl",
                  timer={"rep": 3, "warmup": 1}, progress=False)
    d = df.set_index("backend")
    assert d.loc["flydsl", "flydsl_taken"] == False  # noqa: E712
    assert pd.isna(d.loc["aten", "observed"])           # only flydsl rows are traced by default


def test_speedup_keeps_taken_and_untraced_rows():
    import pandas as pd

    rows = []
    for case, taken in (("a", True), ("b", None), ("c", False)):
        for backend, t in (("aten", 2.0), ("flydsl", 1.0)):
            rows.append({"run_id": "r", "op": "gemm", "case": case, "dtype": "bf16", "backend": backend,
                         "status": "ok", "source": "measured", "time_ms": t,
                         "flydsl_taken": (taken if backend == "flydsl" else None)})
    df = R.frame(rows)
    s = R.speedup(df)
    assert sorted(s["case"]) == ["a", "b"] and (s["speedup"] == 2.0).all()
    assert pd.isna(df.loc[df["case"] == "b", "flydsl_taken"]).all()


def test_cli_trace_and_sweep_trace(capsys, tmp_path):
    from flyexplore.cli import main

    assert main(["trace", "--op", "topk", "--shape", "256x1024x8", "--backend", "aten", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["status"] == "ok" and d["trace"]["observed"] == "CPU: ATen native"
    assert any(k["name"] == "aten::topk" for k in d["trace"]["cpu_ops"])
    assert main(["trace", "--op", "gemm", "--shape", "64x64x64", "--backend", "flydsl", "--dtype", "bf16"]) == 0
    assert "unavailable" in capsys.readouterr().out
    assert main(["trace", "--op", "gemm", "--shape", "64x64", "--backend", "aten"]) == 2
    assert "malformed gemm shape '64x64'" in capsys.readouterr().err
    assert main(["trace", "--op", "gemm", "--shape", "64x64x64", "--backend", "nope"]) == 2
    assert "unknown backend for gemm 'nope'" in capsys.readouterr().err
    out = tmp_path / "s.csv"
    assert main(["sweep", "--op", "rmsnorm", "--shapes", "64x256", "--backends", "aten", "--out", str(out),
                 "--rep", "3", "--quiet", "--trace"]) == 0
    assert R.load(out)["observed"].iloc[0] == "CPU: ATen native"


def test_trace_autotune_on_cpu_records_the_decision():
    """The library's autotune case: on a CPU, bmm max-autotune of ATen vs Inductor's C++ template
    with the caches off (so it really autotunes)."""
    tr = CT.trace_autotune(reps=1)
    assert tr.device == "cpu" and "max-autotune over ATEN,CPP" in tr.notes[0]
    at = tr.autotune_frame()
    assert list(at.columns) == ["op", "name", "family", "time_ms", "winner", "source"]
    assert set(at["op"]) == {"bmm"} and {"ATen", "C++ template"} <= set(at["family"])
    assert at["winner"].sum() == 1 and at.loc[at["winner"], "time_ms"].iloc[0] == at["time_ms"].min()
    assert "autotune bmm: 2 candidates" in tr.to_text()
    fam = tr.family_frame()
    assert "Triton/Inductor" in list(fam["family"]) and fam["share"].sum() == pytest.approx(1.0)
    from flyexplore.errors import UsageError
    with pytest.raises(UsageError, match="malformed gemm shape"):
        CT.trace_autotune("64x64")


def test_backend_status_and_result_text():
    st = CT.backend_status("topk", "256x1024x8")
    assert st["aten"] is None and st["inductor"] is None and "not ROCm" in st["flydsl"]
    r = CT.trace_case("topk", "256x1024x8", "flydsl")
    assert r["status"] == "unavailable" and "unavailable" in CT.result_text(r) and r["message"] in CT.result_text(r)
    assert T.Trace((), ()).family_frame().empty and T.Trace((), ()).autotune_frame().empty


# -- AOTriton: every kernel name its backends launch, at tag 0.13b and in the 0.14.2b tree --------

#: Read from ROCm/aotriton's source (the file says where each list comes from).
AOTRITON_NAMES = json.loads((Path(__file__).parent / "data" / "aotriton_kernel_names.json").read_text())


def _demangled(name: str) -> str:
    """``_ZN5aiter19fmha_fwd_hd128_bf16E`` -> ``aiter::fmha_fwd_hd128_bf16`` (how a profiler
    that demangles shows an aiter symbol)."""
    m = re.fullmatch(r"_ZN5aiter\d+(\w+)E", name)
    return f"aiter::{m.group(1)}" if m else name


@pytest.mark.parametrize("tag", ["0.13b", "0.14.2b"])
def test_aotriton_kernel_names_of_both_tags_get_family_and_backend(tag):
    names = AOTRITON_NAMES[tag]
    assert names["source"]
    seen = 0
    for backend in ("Triton", "aiter", "FlyDSL"):
        for pas, lst in names[backend].items():
            for n in lst:
                for shown in {n, _demangled(n), f"void {n}()"}:
                    c = K.classify(shown)
                    assert (c.family, c.backend) == ("AOTriton", backend), (shown, c)
                    assert c.label == f"AOTriton[{backend}]" and c.rule
                seen += 1
    n_aiter = len(names["aiter"]["fwd"]) + len(names["aiter"]["bwd"])
    assert n_aiter == 32 + 252                          # every fmha v3 symbol AOTriton lists
    assert seen == 7 + n_aiter + (3 if tag == "0.14.2b" else 0)
    assert (names["FlyDSL"]["fwd"], names["FlyDSL"]["bwd"]) == (
        (["flyc_attn_fwd"], ["flyc_bwd_dkdv", "flyc_bwd_dq"]) if tag == "0.14.2b" else ([], []))


@pytest.mark.parametrize("name,family", [
    ("flash_attn_func_gfx950_kernel_0", "unclassified"),   # FlyDSL's own def name: AOTriton exports flyc_attn_fwd
    ("flyc_attn_fwd_0", "unclassified"), ("attn_fwd_kernel", "unclassified"),
    ("fmha_fwd_hd128_bf16", "unclassified"),               # no aiter namespace: not AOTriton's symbol
    ("void ck_tile::FmhaFwdKernel<...>(...)", "CK"),
])
def test_aotriton_rules_never_guess(name, family):
    c = K.classify(name)
    assert c.family == family and c.backend == ""


def test_observed_splits_aotriton_by_backend():
    fly = T.from_kernels([["bwd_preprocess", 1, 20.0], ["flyc_bwd_dkdv", 1, 300.0], ["flyc_bwd_dq", 1, 200.0]])
    assert fly.observed == "AOTriton[FlyDSL],AOTriton[Triton]" and fly.families == ("AOTriton",)
    assert fly.aotriton_backends == ("FlyDSL", "Triton") and fly.flydsl_taken is True
    tri = T.from_kernels([["attn_fwd", 1, 100.0]])
    assert tri.observed == "AOTriton[Triton]" and tri.flydsl_taken is False
    ai = T.from_kernels([["aiter::fmha_fwd_hd128_bf16_causal", 1, 90.0], ["Memset (Device)", 1, 1.0]])
    assert ai.observed == "AOTriton[aiter],runtime" and ai.aotriton_backends == ("aiter",)
    assert T.from_kernels([["nvjet_sm90_x", 1, 5.0]]).aotriton_backends == ()


def test_row_columns_for_attention_count_aotriton_flydsl_as_taken(monkeypatch):
    from types import SimpleNamespace

    from flyexplore.world import env as E
    from flyexplore.ops import get_op

    case = get_op("attention").case("1x32x4096x4096x128:causal=1")
    fly = CT.trace_columns(T.from_kernels([["flyc_attn_fwd", 1, 148.0]]), "flash", "attention", case, "bf16")
    assert fly == {"observed": "AOTriton[FlyDSL]", "flydsl_taken": True,
                   "flydsl_reason": "taken: AOTriton FlyDSL (flyc) kernels flyc_attn_fwd"}
    # AOTriton ran Triton: the reason says so; flydsl_taken stays unset (False would drop a valid row
    # from results.speedup)
    tri = T.from_kernels([["attn_fwd", 1, 520.0]])
    cols = CT.trace_columns(tri, "default", "attention", case, "bf16")
    assert "flydsl_taken" not in cols
    assert cols["flydsl_reason"].startswith("not taken: AOTriton ran Triton (attn_fwd); AOTriton version unknown")
    rocm = SimpleNamespace(platform="rocm", device=SimpleNamespace(arch="gfx950"), versions={"aotriton": "0.14.2"})
    monkeypatch.setattr(E, "collect", lambda *a, **k: rocm)
    cols = CT.trace_columns(tri, "default", "attention", case, "bf16")
    assert "AOTriton's tuning table chose the other backend" in cols["flydsl_reason"]
    d80 = get_op("attention").case("1x32x4096x4096x80")
    assert "rung 80, which has no FlyDSL forward kernel on gfx950" in \
        CT.trace_columns(tri, "default", "attention", d80, "bf16")["flydsl_reason"]
    # no AOTriton kernel (a CUDA flash kernel): nothing about FlyDSL
    cuda = T.Trace((T.TracedKernel("void pytorch_flash::flash_fwd_kernel<...>(...)", "attention", "flash", 1, 9.0),),
                   (), (), "cuda")
    assert CT.trace_columns(cuda, "flash", "attention", case, "bf16") == {"observed": "attention"}

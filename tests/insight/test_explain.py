"""The explainer's environment, switch and command-line parts, on the installed torch 2.15
(CUDA wheel, CPU machine). Agreement with torch's own predicates is in
test_explain_agreement.py."""
from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from conftest import examples  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flyexplore.insight import explain as E  # noqa: E402
from flyexplore.ops.attention import flydsl as AF  # noqa: E402
from flyexplore.ops.topk import flydsl as TF  # noqa: E402
from flyexplore.world import switches as S  # noqa: E402
from flyexplore.cli import main  # noqa: E402
from flyexplore.errors import UsageError  # noqa: E402


def _failed(ex, kind=None):
    return {c.name for c in ex.conditions if c.ok is False and (kind is None or c.kind == kind)}


def test_this_machine_is_explained_as_it_is():
    """CUDA torch on a CPU: the environment fails for the right reasons, the call is judged
    on its own, and every condition names its torch source."""
    ex = E.explain_shape("rmsnorm", "8192x4096", "bf16")
    assert not ex.taken and ex.call_ok and not ex.environment_ok
    assert {"ROCm build", "arch gfx950"} <= _failed(ex, "environment")
    assert all(c.source for c in ex.conditions)
    assert any("flydsl_rmsnorm_impl.py" in c.source for c in ex.conditions)
    assert "not a ROCm build" in ex.reason
    d = json.loads(ex.to_json())
    assert d["taken"] is False and d["call_ok"] is True and d["conditions"]


def test_assumed_rocm_what_if():
    ex = E.explain_shape("rmsnorm", "8192x4096", "bf16", assume_rocm=True)
    assert ex.taken and ex.assumed and "gfx950" in ex.assumed
    ex = E.explain_shape("rmsnorm", "2048x4096", "bf16", assume_rocm=True)
    assert not ex.taken and _failed(ex) == {"tuned region"}
    assert "needs M >= 8192" in ex.reason
    ex = E.explain_shape("rmsnorm", "8192x4096", "bf16", assume_rocm=True, arch="gfx942")
    assert _failed(ex) == {"arch gfx950"}


def test_switches_show_up_in_the_explanation():
    with S.flydsl("topk", enabled=False):
        ex = E.explain_shape("topk", "4096x2048x8", "fp32", assume_rocm=True)
        assert _failed(ex) == {"op enabled"}
        assert "disable_operations('topk', 'topk.values')" in ex.reason
    import torch.backends.python_native as pn

    with pn.flydsl.disabled():                 # torch's own DSL-wide switch
        ex = E.explain_shape("rmsnorm", "8192x4096", "bf16", assume_rocm=True)
        assert _failed(ex) == {"flydsl DSL enabled"}
    assert E.explain_shape("topk", "4096x2048x8", "fp32", assume_rocm=True).taken


def test_environment_rules(monkeypatch):
    f = E.facts(assume_rocm=True)
    ok = E.explain("rmsnorm", env=f, x=E.TensorDesc((8192, 4096), "bf16"), normalized_shape=[4096],
                   weight=E.TensorDesc((4096,), "bf16"))
    assert ok.taken

    def with_env(**kw):
        return E.explain("rmsnorm", env=dataclasses.replace(f, **kw), x=E.TensorDesc((8192, 4096), "bf16"),
                         normalized_shape=[4096], weight=E.TensorDesc((4096,), "bf16"))

    assert _failed(with_env(environ={"TORCH_DISABLE_NATIVE_JIT": "1"})) == {"native JIT not disabled"}
    assert with_env(environ={"TORCH_DISABLE_NATIVE_JIT": "0"}).taken       # torch reads int(value) == 1
    assert _failed(with_env(flydsl_version="0.5.0")) == {"flydsl version"}
    assert with_env(flydsl_version="0.5.0", environ={"TORCH_NATIVE_SKIP_VERSION_CHECK": "1"}).taken
    assert _failed(with_env(flydsl_version="0.3.0rc1")) == {"flydsl version"}   # stable only (eager)
    assert _failed(with_env(flydsl_version=None)) == {"flydsl installed"}
    assert _failed(with_env(environ={"FLYDSL_GPU_ARCH": "gfx942"})) == {"arch gfx950"}
    assert with_env(device_arch="gfx942", environ={"FLYDSL_GPU_ARCH": "gfx950"}).taken
    assert _failed(with_env(registered=())) == {"override registered"}


def test_compile_environment_rules():
    f = E.facts(assume_rocm=True, compile_options=S.compile_options(True))
    call = dict(a=E.TensorDesc((64, 64), "bf16"), b=E.TensorDesc((64, 64), "bf16", (1, 64)))
    assert E.explain("gemm", env=f, **call).taken
    # the Inductor gate reads the device's gcnArchName only: FLYDSL_GPU_ARCH does not help
    g = dataclasses.replace(f, device_arch="gfx942", environ={"FLYDSL_GPU_ARCH": "gfx950"})
    ex = E.explain("gemm", env=g, **call)
    assert _failed(ex) == {"device arch gfx950"} and "not consulted" in ex.reason
    # Inductor accepts 0.3 prereleases and ignores TORCH_NATIVE_SKIP_VERSION_CHECK
    assert E.explain("gemm", env=dataclasses.replace(f, flydsl_version="0.3.0rc1"), **call).taken
    h = dataclasses.replace(f, flydsl_version="0.5.0", environ={"TORCH_NATIVE_SKIP_VERSION_CHECK": "1"})
    assert _failed(E.explain("gemm", env=h, **call)) == {"flydsl runtime"}
    cur = E.facts(assume_rocm=True)        # this process: FLYDSL not listed, max-autotune off
    assert _failed(E.explain("gemm", env=cur, **call)) == {"FLYDSL listed", "max-autotune"}


def test_explanation_from_real_tensors():
    x = torch.empty(8192, 4096, dtype=torch.bfloat16)
    ex = E.explain("rmsnorm", env=E.facts(assume_rocm=True), x=x, normalized_shape=(4096,),
                   weight=torch.empty(4096, dtype=torch.bfloat16))
    assert "device" in _failed(ex)                          # a CPU tensor: FlyDSL needs the GPU
    assert ex.arguments["x"] == "bf16[8192, 4096]"
    assert E.TensorDesc.of(x.t()).stride == (1, 4096)


@settings(max_examples=examples(200, quick=30), deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=4), st.data())
def test_tensor_desc_contiguity_matches_torch(shape, data):
    stride = data.draw(st.lists(st.integers(0, 40), min_size=len(shape), max_size=len(shape)))
    t = torch.empty(4096).as_strided(shape, stride)
    assert E.TensorDesc.of(t).is_contiguous() == t.is_contiguous()
    assert E.TensorDesc(tuple(shape), "fp32").stride == tuple(torch.empty(shape).stride())


def test_published_suites_are_eligible_under_assumed_rocm():
    """Every published MI355X RMSNorm and TopK case qualifies (they were measured on FlyDSL)."""
    from flyexplore.ops import get_op

    f = E.facts(assume_rocm=True)
    for op in ("rmsnorm", "topk"):
        suite = get_op(op).get_suite("published")
        for case, dtype in suite.pairs():
            ex = E.explain_case(op, case, dtype, env=f)
            assert ex.taken, (op, case.label, ex.reason)
    ex = E.explain_case("topk", get_op("topk").case("4096x2048x8"), "fp32", env=f)
    assert ex.kernel == "register"
    ex = E.explain_case("topk", get_op("topk").case("4096x65536x512"), "fp32", env=f)
    assert ex.kernel == "radix K 384-831, N 32768-131072"


def test_describe_options_and_errors():
    d = E.describe("gemm", "64x128x256:NN", "fp16", {"a_offset": "3", "bias": "1"})
    assert d["a"].stride == (256, 1) and d["b"].stride == (128, 1) and d["a"].storage_offset == 3 and d["bias"]
    d = E.describe("grouped_gemm", "g8x512x4096x4096", "bf16")
    assert d["a"].shape == (4096, 4096) and d["b"].shape == (8, 4096, 4096)
    d = E.describe("scaled_gemm", "32x4096x4096", "mxfp4")
    assert d["a"].shape == (32, 2048) and d["scale_a"].shape == (32, 128)
    with pytest.raises(UsageError, match="malformed grouped_gemm shape"):
        E.describe("grouped_gemm", "8x512x4096", "bf16")
    with pytest.raises(UsageError, match="unknown explain option for topk 'eps'"):
        E.describe("topk", "256x1024x8", "fp32", {"eps": "1"})
    with pytest.raises(UsageError, match="unknown dtype for topk 'int8'"):
        E.describe("topk", "256x1024x8", "int8")
    with pytest.raises(UsageError, match="unknown operator for explain 'conv'"):
        E.explain("conv")
    with pytest.raises(UsageError, match="stride"):
        E.describe("gemm", "64x64x64", "bf16", {"a_stride": "1"})


def test_cli_explain(capsys):
    # exit codes a script can use: 0 YES, 1 NO, 2 usage error (flyexplore.cli)
    assert main(["explain", "--op", "gemm", "--shape", "4096x4096x4104:NT", "--assume-rocm", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["taken"] is False and "K=4104 is not a multiple of 32" in d["reason"]
    assert d["compile_options"]["max_autotune_gemm_backends"].endswith("FLYDSL")
    assert main(["explain", "--op", "grouped_gemm", "--shape", "g8x512x4096x4096", "--assume-rocm"]) == 0
    assert "grouped_gemm: FlyDSL YES" in capsys.readouterr().out
    assert main(["explain", "--op", "scaled_gemm", "--shape", "32x4096x4096", "--dtype", "mxfp8", "--assume-rocm",
                 "--opt", "swizzle=swizzle_32_4_4"]) == 1
    assert "FlyDSL needs NO_SWIZZLE" in capsys.readouterr().out
    for argv, msg in ((["explain", "--op", "conv", "--shape", "1x1"], "unknown operator for explain 'conv'"),
                      (["explain", "--op", "topk", "--shape", "1x0x1"], "non-positive topk n=0"),
                      (["explain", "--op", "topk", "--shape", "256x1024x8", "--cu", "0"], "--cu"),
                      (["explain", "--op", "gemm", "--shape", "8x8x8", "--compile-options", "{bad"], "JSON"),
                      (["explain", "--op", "gemm", "--shape", "8x8x8", "--opt", "bias"], "malformed option 'bias'"),
                      (["explain", "--op", "rmsnorm"], "required")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("flyexplore: error:") and msg in err and "\n" not in err


def test_cli_switches(capsys):
    assert main(["switches", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["op"] for r in rows] == list(S.OPS)
    assert main(["switches"]) == 0
    assert "rmsnorm" in capsys.readouterr().out


# -- the dispatch inspector's front door and the eligibility grid -----------------------------

def test_eligibility_grid_agrees_with_explain_cell_by_cell():
    ms, ns = [1024, 2048, 4096, 8192], [2048, 4096, 8192, 16384, 114688, 131072]
    g = E.eligibility_grid("rmsnorm", ms, ns, "bf16")
    assert list(g.columns) == ["m", "n", "dtype", "value", "call_ok", "kernel", "reason"]
    assert len(g) == len(ms) * len(ns) and list(g["m"][:len(ns)]) == [1024] * len(ns)
    for row in g.itertuples():
        ex = E.explain_text("rmsnorm", f"{row.m}x{row.n}", "bf16")
        assert (row.value, row.call_ok, row.reason) == (ex.taken, ex.call_ok, ex.reason)
    taken = {(r.m, r.n) for r in g.itertuples() if r.value}
    # RMSNorm's tuned region (torch 2.15 _fused_rms_norm_fwd_perf_wins)
    assert taken == {(8192, 4096), (4096, 8192), (8192, 8192), (2048, 16384), (4096, 16384), (8192, 16384),
                     (2048, 114688), (4096, 114688), (8192, 114688)}
    assert g.set_index(["m", "n"]).loc[(8192, 131072), "reason"].startswith("not taken: N=131072 is outside")


def test_eligibility_grid_topk_kernel_families_and_switches():
    g = E.eligibility_grid("topk", 2048, [1024, 8192, 16384, 262144], dims={"k": [8, 32, 256, 1024]})
    kern = g.set_index(["n", "k"])["kernel"]
    assert kern[(1024, 8)] == kern[(8192, 8)] == "register"
    assert kern[(16384, 256)] == "radix K 64-256, N 8192-32768" and kern[(262144, 1024)].startswith("radix K 832")
    assert kern.isna()[(16384, 8)] and kern.isna()[(8192, 32)]
    assert set(g["dtype"]) == {"fp32"}  # the operator's first dtype
    with S.flydsl("topk", enabled=False):  # judged with this process's switches
        off = E.eligibility_grid("topk", 2048, 1024, dims={"k": 8})
    assert not off["value"][0] and off["call_ok"][0] and "disabled" in off["reason"][0]
    gemm = E.eligibility_grid("gemm", [16, 17], [4096, 4100], "bf16", dims={"k": 4096})
    assert list(gemm["value"]) == [True, False, True, False]  # N % 8; M is free (A row-major)


@pytest.mark.parametrize("kw, msg", [
    (dict(op="rmsnorm", ms=[8], ns=None), "needs values for n"),
    (dict(op="topk", ms=[8], ns=[8]), "needs values for k"),
    (dict(op="rmsnorm", ms=[8], ns=[8], dims={"k": [1]}), "unknown dimension of rmsnorm 'k'"),
    (dict(op="rmsnorm", ms=[0], ns=[8]), "must be positive"),
    (dict(op="rmsnorm", ms=[8], ns=[8], dims={"m": 4}), "dimension 'm' given twice"),
    (dict(op="attention", ms=[8], ns=[8]), "unknown operator for explain 'attention'"),
])
def test_eligibility_grid_bad_input(kw, msg):
    with pytest.raises(UsageError, match=msg):
        E.eligibility_grid(**kw)


def test_explain_text_takes_catalogue_shapes_options_and_archs():
    nt = E.explain_text("grouped_gemm", "8x512x4096x4096:layout=NT")
    assert not nt.call_ok and "B contiguous" in _failed(nt)
    assert E.explain_text("grouped_gemm", "g8x512x4096x4096").taken
    ragged = E.explain_text("grouped_gemm", "4x1024x4096x4096:ms=0/1024/512/1024")
    assert ragged.taken and any("ragged groups" in n for n in ragged.notes)
    row = E.explain_text("scaled_gemm", "32x4096x4096:scaling=row", "fp8_e4m3")
    assert {"recipe A", "recipe B"} <= _failed(row)
    assert E.explain_text("scaled_gemm", "32x4096x4096", "mxfp4").taken
    off = E.explain_text("gemm", "16x28672x4096:NT", "bf16", "a_offset=3; b_stride=1,4096")
    assert _failed(off) == {"A origin aligned"} and off.arguments["b"] == "bf16[4096, 28672] stride (1, 4096)"
    assert "arch gfx942" in E.explain_text("rmsnorm", "8192x4096", "bf16", arch="gfx942").reason
    here = E.explain_text("rmsnorm", "8192x4096", "bf16", arch=None)
    assert here.assumed is None and "ROCm build" in _failed(here)
    # GEMMs are judged with FLYDSL on by default (the flydsl backend's options), or as given
    assert E.explain_text("gemm", "64x64x64", "bf16").taken
    assert "FLYDSL listed" in _failed(E.explain_text("gemm", "64x64x64", "bf16", compile_options={}))
    assert E.parse_options("a=1; b=2,3\nc = x") == {"a": "1", "b": "2,3", "c": "x"}
    assert E.parse_options(None) == {} and E.parse_options({"a": 1}) == {"a": 1}


@pytest.mark.parametrize("args, msg", [
    (("rmsnorm", ""), "no rmsnorm shape given"),
    (("rmsnorm", "8x8", "bf16", "eps"), "malformed option 'eps'"),
    (("rmsnorm", "8x8", "bf16", "=1"), "malformed option '=1'"),
    (("sdpa", "8x8"), "unknown operator for explain 'sdpa'"),
])
def test_explain_text_bad_input(args, msg):
    with pytest.raises(UsageError, match=msg):
        E.explain_text(*args)
    with pytest.raises(UsageError, match="bad arch 'mi355'"):
        E.explain_text("rmsnorm", "8x8", arch="mi355")


def test_topk_bands_name_every_kernel_family():
    b = TF.topk_bands()
    assert list(b["kernel"]) == ["register"] + [TF.topk_kernel(k0, n0) for k0, _, n0, _ in TF.TOPK_RADIX_BANDS]


# -- attention: SDPA -> AOTriton -> its FlyDSL ("flyc") kernels -----------------------------------

def _cond(ex, name):
    return next(c for c in ex.conditions if c.name == name)


@pytest.mark.parametrize("shape,rung,ok", [
    ("1x32x4096x4096x128:causal=1", 128, True), ("1x32x4096x4096x64", 64, True),
    ("1x16x4096x4096x256:causal=1", 256, True), ("1x8x4096x4096x100", 128, True),   # padded to 128
    ("1x32x4096x4096x16", 32, True),                                               # gfx950: 16 -> 32
    ("1x32x4096x4096x80", 80, False), ("1x32x4096x4096x48", 48, False), ("1x32x4096x4096x40", 48, False),
    ("1x32x4096x4096x80:bwd", 96, True), ("1x32x4096x4096x48:causal=1,bwd", 64, True),  # gfx950 bwd fixes
    ("1x4x128x128x1024", None, False),
])
def test_attention_head_dims_inside_and_outside_the_flydsl_set(shape, rung, ok):
    """What-if on gfx950 with AOTriton 0.14.2b: the head-dim condition decides; torch's SDPA pick
    cannot be asked away from the device, so the best verdict is 'unverified'."""
    ex = AF.explain_attention(shape, "bf16", arch="gfx950", aotriton="0.14.2")
    hd = _cond(ex, "head dim")
    assert hd.ok is ok and ex.arguments["rung"] == rung
    assert ex.verdict == ("unverified" if ok else "not eligible")
    assert _cond(ex, "SDPA picks AOTriton").ok is None
    assert all(c.ok is True for c in ex.conditions if c.kind == "environment")
    assert (ex.kernel is not None) is ok
    if ok:
        assert ex.reason.startswith("unverified: not evaluated here")
        assert ex.kernel == ("flyc_attn_fwd" if ":bwd" not in shape and ",bwd" not in shape
                             else "flyc_bwd_dkdv + flyc_bwd_dq (after the Triton bwd_preprocess)")
    else:
        assert ex.reason.startswith("not eligible: ") and hd.detail in ex.reason
    assert any("the final choice is AOTriton's" in n and "tuning table" in n for n in ex.notes)
    assert "assumed: a ROCm build of torch on gfx950 with AOTriton 0.14.2b (given)" in ex.to_text()


def test_attention_dtype_version_arch_library_and_backend_rules():
    ex = AF.explain_attention("1x32x4096x4096x128", "fp32", arch="gfx950", aotriton="0.14.2")
    assert _cond(ex, "dtype").ok is False and "fp32 stays on Triton" in ex.reason
    old = AF.explain_attention("1x32x4096x4096x128", "bf16", arch="gfx950", aotriton="0.13b")
    assert _cond(old, "AOTriton has flyc").ok is False and old.verdict == "not eligible" and old.kernel is None
    assert "aiter fmha v3 is declared for head dim 128" in " ".join(old.notes)   # what 0.13b runs instead
    mi300 = AF.explain_attention("1x32x4096x4096x128", "bf16", arch="gfx942", aotriton="0.14.2")
    assert _cond(mi300, "arch").ok is False
    assert _cond(AF.explain_attention("1x32x4096x4096x128", "bf16", arch="gfx1201"), "head dim").ok is True
    ck = AF.explain_attention("1x32x4096x4096x128", "bf16", arch="gfx950", fa_library="ck")
    assert _cond(ck, "flash-attention library").ok is False and "CK runs flash and efficient" in ck.reason
    pinned = AF.explain_attention("1x32x4096x4096x128", "bf16", backend="flash", arch="gfx950", fa_library="ck")
    assert _cond(pinned, "flash-attention library").ok is True   # flyexplore's flash backend pins aotriton
    for be in ("ck", "math", "cudnn"):
        ex = AF.explain_attention("1x32x4096x4096x128", "bf16", backend=be, arch="gfx950")
        assert _cond(ex, "SDPA backend").ok is False and ex.verdict == "not eligible"
    d = AF.explain_attention("1x32x4096x4096x128", "bf16", arch="gfx950").to_dict()
    assert d["verdict"] == "unverified" and d["arguments"]["aotriton"] == "0.14.2b" and d["sdpa"] is None
    assert "the version torch main pins" in d["assumed"]


def test_attention_on_this_cuda_cpu_machine():
    """No ROCm here: not eligible for the right reasons, and the what-if is named."""
    ex = AF.explain_attention("1x32x4096x4096x128:causal=1", "bf16")
    assert {"ROCm build", "AOTriton bundled"} <= _failed(ex, "environment")
    assert "ask a what-if with --arch gfx950" in ex.reason and ex.assumed is None


@pytest.mark.parametrize("kw,msg", [
    (dict(shape="1x32x4096x4096"), "malformed attention shape"), (dict(shape="1x32x4096x4096x128", dtype="int8"), "dtype"),
    (dict(shape="1x32x4096x4096x128", backend="xformers"), "unknown attention backend 'xformers'"),
    (dict(shape="1x32x4096x4096x128", fa_library="triton"), "unknown ROCm flash-attention library 'triton'"),
    (dict(shape="1x32x4096x4096x128", arch="mi355"), "bad arch 'mi355'"),
    (dict(shape="1x32x4096x4096x128", aotriton="latest"), "bad AOTriton version 'latest'"),
])
def test_attention_bad_input(kw, msg):
    with pytest.raises(UsageError, match=msg):
        AF.explain_attention(**kw)


def test_cli_explain_attention(capsys):
    assert main(["explain", "--op", "attention", "--shape", "1x32x4096x4096x128:causal=1", "--arch", "gfx950",
                 "--aotriton", "0.14.2"]) == 3  # unverified here
    out = capsys.readouterr().out
    assert out.startswith("attention: AOTriton FlyDSL UNVERIFIED") and "flyc_attn_fwd" in out
    assert "note: the final choice is AOTriton's" in out
    assert main(["explain", "--op", "attention", "--shape", "1x32x4096x4096x80", "--arch", "gfx950", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "not eligible" and "rung 80" in d["reason"]
    for argv, msg in ((["--opt", "backend=foo"], "unknown attention backend 'foo'"),
                      (["--opt", "window=1"], "unknown explain option for attention 'window'"),
                      (["--aotriton", "x1"], "bad AOTriton version 'x1'")):
        assert main(["explain", "--op", "attention", "--shape", "1x32x4096x4096x128", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("flyexplore: error:") and msg in err and "\n" not in err
    assert main(["explain", "--op", "gemm", "--shape", "8x8x8", "--aotriton", "0.14.2"]) == 2
    assert "--aotriton is for --op attention only" in capsys.readouterr().err


def test_attention_asks_torch_itself_in_a_rocm_environment(monkeypatch):
    """The non-what-if branch on a (faked) ROCm gfx950 environment with AOTriton 0.14.2: torch's
    own _fused_sdp_choice and can_use_*_attention are called for real (here on CPU tensors,
    where torch picks its CPU flash kernel), and their answer decides the SDPA condition."""
    from types import SimpleNamespace

    from flyexplore.world import env as EN

    rocm = SimpleNamespace(platform="rocm", device=SimpleNamespace(arch="gfx950"),
                           versions={"torch": "2.15.0+rocm", "aotriton": "0.14.2"})
    monkeypatch.setattr(EN, "collect", lambda *a, **k: rocm)
    ex = AF.explain_attention("1x4x128x128x64:causal=1", "bf16", device="cpu")
    sd = _cond(ex, "SDPA picks AOTriton")
    assert ex.assumed is None and ex.sdpa["choice"] == "flash" and sd.ok is True
    assert ex.sdpa["priority"][:2] == ["flash", "efficient"]
    assert "All tensors need to be on cuda device" in ex.sdpa["reasons"]["efficient"]
    assert ex.verdict == "eligible" and ex.taken and ex.reason.startswith("FlyDSL eligible (flyc_attn_fwd)")
    refused = AF.explain_attention("1x4x128x128x64:causal=1", "bf16", backend="efficient", device="cpu")
    sd = _cond(refused, "SDPA picks AOTriton")
    assert sd.ok is False and refused.sdpa["choice"].startswith("none") and "can_use_efficient_attention" in sd.detail

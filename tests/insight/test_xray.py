"""Kernel X-ray: the ISA parser and occupancy calculator on hand-written inputs, the readiness
checks, the explainer hook, and real compiles of torch 2.15's FlyDSL kernels for gfx950
(RMSNorm for two N and two dtypes, one TopK and one GEMM) in one worker process per session."""
from __future__ import annotations

import json
import os
import re
import time

import pytest

from flyexplore.world import env as E
from flyexplore.insight import xray as X
from flyexplore.views import xray as XV
from flyexplore.cli import main
from flyexplore.errors import UsageError

# ------------------------------------------------------------------ hand-written ISA
TOY_ISA = """\
\t.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
\t.amdhsa_code_object_version 6
\t.text
\t.globl\ttoy
\t.p2align\t8
\t.type\ttoy,@function
toy:                                    ; @toy
; %bb.0:
\ts_load_dwordx4 s[0:3], s[4:5], 0x0
\tv_mfma_f32_16x16x32_bf16 a[0:3], v[0:3], v[4:7], a[0:3]
\tv_add_f32_e32 v1, v2, v3      ; a comment
\tv_accvgpr_read_b32 v5, a0
\tbuffer_load_dwordx4 v[0:3], v4, s[0:3], 0 offen
\tglobal_store_dword v[0:1], v2, off
\tscratch_store_dword off, v3, s0
\tds_read_b128 v[0:3], v4
\ts_add_u32 s0, s0, 1
\ts_waitcnt vmcnt(0)
\ts_barrier
\ts_cbranch_scc1 .LBB0_2
; %bb.1:
\ts_branch .LBB0_2
.LBB0_2:
\ts_endpgm
.Lfunc_end0:
\t.size\ttoy, .Lfunc_end0-toy
\t.globl\ttoy2
\t.type\ttoy2,@function
toy2:
\tv_mov_b32_e32 v0, 0
\ts_endpgm
.Lfunc_end1:
\t.size\ttoy2, .Lfunc_end1-toy2
\t.section\t.rodata,"a",@progbits
\t.amdhsa_kernel toy
\t\t.amdhsa_group_segment_fixed_size 2048
\t\t.amdhsa_next_free_vgpr 48
\t\t.amdhsa_next_free_sgpr 20
\t\t.amdhsa_accum_offset 12
\t.end_amdhsa_kernel
\t.set .Ltoy.num_vgpr, 9
\t.set .Ltoy.num_agpr, 32
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     32
    .args:
      - .address_space:  global
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
    .group_segment_fixed_size: 2048
    .kernarg_segment_align: 8
    .kernarg_segment_size: 8
    .max_flat_workgroup_size: 256
    .name:           toy
    .private_segment_fixed_size: 16
    .reqd_workgroup_size:
      - 128
      - 1
      - 1
    .sgpr_count:     26
    .sgpr_spill_count: 0
    .symbol:         toy.kd
    .vgpr_count:     44
    .vgpr_spill_count: 3
    .wavefront_size: 64
  - .args:           []
    .group_segment_fixed_size: 0
    .max_flat_workgroup_size: 1024
    .name:           toy2
    .private_segment_fixed_size: 0
    .sgpr_count:     6
    .symbol:         toy2.kd
    .vgpr_count:     1
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa--gfx950
amdhsa.version:
  - 1
  - 2
...

\t.end_amdgpu_metadata
"""


def test_parse_isa_reads_metadata_descriptor_and_set_lines():
    toy, toy2 = X.parse_isa(TOY_ISA)
    assert (toy.name, toy.vgprs, toy.agprs, toy.vgprs_total, toy.vgprs_descriptor) == ("toy", 9, 32, 44, 48)
    assert (toy.sgprs, toy.vgpr_spills, toy.sgpr_spills, toy.scratch_bytes) == (26, 3, 0, 16)
    assert (toy.lds_bytes, toy.workgroup_size, toy.wavefront_size) == (2048, 128, 64)  # reqd size wins
    assert toy.waves_per_workgroup == 2 and toy.target == "amdgcn-amd-amdhsa--gfx950"
    assert (toy2.name, toy2.vgprs_total, toy2.agprs, toy2.workgroup_size, toy2.sgprs) == ("toy2", 1, 0, 1024, 6)


def test_parse_isa_without_metadata_is_an_error():
    with pytest.raises(ValueError, match="no .amdgpu_metadata"):
        X.parse_isa("\t.text\nfoo:\n\ts_endpgm\n")


def test_count_instructions_by_class():
    c = X.count_instructions(TOY_ISA, "toy")
    assert c == {"mfma": 1, "valu": 2, "vmem": 2, "scratch": 1, "lds": 1, "smem": 1, "branch": 2,
                 "other": 3, "salu": 1, "total": 14}
    assert X.count_instructions(TOY_ISA) == c            # first function by default
    c2 = X.count_instructions(TOY_ISA, "toy2")
    assert (c2["valu"], c2["other"], c2["total"]) == (1, 1, 2)
    with pytest.raises(ValueError, match="nope"):
        X.count_instructions(TOY_ISA, "nope")


def _res(vgprs_total=32, sgprs=20, lds=0, wg=256, wave=64, agprs=0):
    return X.KernelResources("k", vgprs_total - agprs, agprs, vgprs_total, sgprs, 0, 0, 0, lds, wg, wave)


def test_occupancy_matches_llvm_gfx90a_agpr_example():
    # LLVM test CodeGen/AMDGPU (kernel_32_agprs, gfx90a): 9 VGPRs + 32 AGPRs -> 44 unified, Occupancy 8.
    toy = X.parse_isa(TOY_ISA)[0]
    o = X.occupancy(toy)
    assert (o.vgpr_alloc, o.vgpr_waves_per_simd, o.waves_per_simd, o.limited_by) == (48, 8, 8, ("waves",))
    assert o.lds_alloc == 2560 and o.limits["lds"] == 64      # 2048 B rounds up to two 1280-B blocks
    assert o.limits["barriers"] == 16 and o.fraction == 1.0


@pytest.mark.parametrize("res, waves, wgs, limited", [
    (_res(vgprs_total=129, wg=256), 3, 3, ("vgprs",)),           # alignTo(129, 8) = 136 -> 512 // 136 = 3
    (_res(vgprs_total=128, wg=256), 4, 4, ("vgprs",)),           # exactly 4 waves of 128
    (_res(sgprs=101, wg=64), 7, 28, ("sgprs",)),                 # SGPR table: > 100 -> 7 waves
    (_res(sgprs=100, wg=64), 8, 32, ("waves",)),                 # single-wave workgroups: no barrier cap
    (_res(lds=69632, wg=256), 2, 2, ("lds",)),                   # 160 KiB // alignTo(69632, 1280) = 2
    (_res(lds=81920, wg=256), 2, 2, ("lds",)),                   # exactly half the LDS
    (_res(lds=81921, wg=256), 1, 1, ("lds",)),                   # one byte more: one workgroup
    (_res(vgprs_total=52, lds=65536, wg=1024), 8, 2, ("waves",)),  # 16-wave workgroups: 2 per CU
    (_res(vgprs_total=300, wg=1024), 0, 0, ("vgprs",)),          # 1 wave/SIMD cannot hold 16 waves
    (_res(vgprs_total=520, wg=64), 0, 0, ("vgprs",)),            # more than the register file
    (_res(wg=192), 7.5, 10, ("waves",)),                         # 3 waves per workgroup, 10 fit
])
def test_occupancy_rules(res, waves, wgs, limited):
    o = X.occupancy(res)
    assert (o.waves_per_simd, o.workgroups_per_cu, o.limited_by) == (waves, wgs, limited)


def test_occupancy_rejects_wave32():
    with pytest.raises(ValueError, match="wave64"):
        X.occupancy(_res(wave=32))


def test_gfx950_limits_name_their_sources():
    g = X.GFX950
    assert (g.max_waves_per_simd, g.simds_per_cu, g.vgprs_per_lane, g.vgpr_granule) == (8, 4, 512, 8)
    assert (g.lds_bytes_per_cu, g.lds_granule_bytes, g.compute_units) == (163840, 1280, 256)
    text = " ".join(g.sources)
    for s in ("AMDGPUBaseInfo.cpp", "AMDGPUUsage", "gpu-specs"):
        assert s in text


# ------------------------------------------------------------------ readiness
def _fake_lld(tmp_path, name, line):
    p = tmp_path / name
    p.write_text(f"#!/bin/sh\necho '{line}'\n")
    p.chmod(0o755)
    return str(p)


def test_find_amdgpu_lld_prefers_new_enough(tmp_path, monkeypatch):
    old = _fake_lld(tmp_path, "old", "Debian LLD 14.0.6 (compatible with GNU linkers)")
    new = _fake_lld(tmp_path, "new", "Debian LLD 22.1.8 (compatible with GNU linkers)")
    monkeypatch.setattr(E, "_lld_candidates", lambda environ: [(old, "a"), (new, "b")])
    got = E.find_amdgpu_lld({})
    assert (got.path, got.major, got.amdgpu_capable) == (new, 22, True)
    monkeypatch.setattr(E, "_lld_candidates", lambda environ: [(old, "a")])
    got = E.find_amdgpu_lld({})
    assert (got.major, got.amdgpu_capable) == (14, False)
    r = E.xray_readiness({"torch": "2.15.0", "flydsl": "0.3.4.1"}, {})
    bad = [c for c in r.checks if not c.ok]
    assert [c.name for c in bad] == ["AMDGPU-capable ld.lld"] and "LLD 14" in bad[0].detail
    assert "lld-22" in bad[0].fix
    monkeypatch.setattr(E, "_lld_candidates", lambda environ: [])
    assert E.find_amdgpu_lld({}) is None
    assert not E.xray_readiness({"torch": "2.15.0", "flydsl": "0.3.4.1"}, {}).ready


def test_xray_readiness_names_torch_and_flydsl_problems():
    r = E.xray_readiness({"torch": "2.11.0+cu130", "flydsl": "0.5.0"})
    names = {c.name: c for c in r.checks}
    assert not names["torch >= 2.15 with FlyDSL kernel builders"].ok
    assert not names["flydsl version accepted"].ok
    r = E.xray_readiness({"torch": "2.15.0", "flydsl": "not installed"})
    assert not r.ready and any(c.name == "flydsl installed" for c in r.failed)


def test_env_reports_xray_readiness_here():
    env = E.collect(refresh=True)
    assert env.flydsl_xray is not None and env.flydsl_xray.ready, env.flydsl_xray
    assert "kernel X-ray" in env.to_text()
    assert env.to_dict()["flydsl_xray"]["ready"] is True


# ------------------------------------------------------------------ bad input, explainer hook
@pytest.mark.parametrize("args, msg", [
    (("conv", "1x1", "bf16"), "unknown operator for xray 'conv'"),
    (("rmsnorm", "8192x4096", "fp64"), "unknown dtype for rmsnorm xray 'fp64'"),
    (("rmsnorm", "8192", "bf16"), "malformed rmsnorm shape"),
    (("grouped_gemm", "8x512x4096", "bf16"), "malformed grouped_gemm shape"),
])
def test_bad_input_is_a_usage_error(args, msg):
    with pytest.raises(UsageError, match=re.escape(msg)):
        X.xray(*args)


def test_bad_arch_is_a_usage_error():
    with pytest.raises(UsageError, match="bad arch"):
        X.xray("rmsnorm", "8192x4096", "bf16", arch="mi355")


@pytest.mark.parametrize("args, kw, op, shape, dtype, words", [
    (("rmsnorm", "16x4096", "bf16"), {}, "rmsnorm", "16x4096", "bf16", "needs M >= 8192"),
    (("rmsnorm", "8192x4096", "bf16"), {"arch": "gfx942"}, "rmsnorm", "8192x4096", "bf16", "need gfx950"),
    (("topk", "4096x4096x8", "bf16"), {}, "topk", "4096x4096x8", "bf16", "fp32 only"),
    # an MXFP GEMM is judged as the scaled_gemm it lowers from (the GEMM family's XRAY["explain"])
    (("gemm", "32x4096x4000:NT", "mxfp4"), {}, "scaled_gemm", "32x4096x4000", "mxfp4", "multiple of 128"),
])
def test_a_case_the_explainer_refuses_is_refused_with_its_reason(monkeypatch, args, kw, op, shape, dtype, words):
    from flyexplore.insight.explain import explain_text

    monkeypatch.setattr(X, "_ensure_ready", lambda: pytest.fail("no worker for a refused case"))
    x = X.xray(*args, **kw)
    ex = explain_text(op, shape, dtype, arch=kw.get("arch", "gfx950"))
    assert not ex.taken and words in ex.reason
    assert (x.eligible, x.reason, x.kernels) == (False, ex.reason, ())
    assert x.verdict_source == "flyexplore.insight.explain.explain_text"


def test_the_explainer_is_asked_with_the_xrays_autotune_setting():
    # N=64: no baseline grouped config fits (TILE_N 128), an autotuning candidate does
    req = X._request("grouped_gemm", "2x4x64x64", "bf16")
    off, on = X._explainer_verdict(req, "gfx950", False), X._explainer_verdict(req, "gfx950", True)
    assert not off[0] and "autotuning off" in off[1]
    assert on[0] and on[2] == "flyexplore.insight.explain.explain_text"


@pytest.mark.slow
def test_an_eligible_case_carries_the_explainers_verdict_and_is_compiled():
    from flyexplore.insight.explain import explain_text

    x = X.xray("rmsnorm", "8192x4096", "fp16")
    ex = explain_text("rmsnorm", "8192x4096", "fp16", arch="gfx950")
    assert ex.taken and (x.eligible, x.reason, x.verdict_source) == (True, ex.reason, "flyexplore.insight.explain.explain_text")
    assert [k.family for k in x.kernels] == ["rmsnorm fwd"] and x.error is None, x.to_text()
    assert not any("torch's own predicate" in n for n in x.notes)       # torch agrees


@pytest.mark.slow
def test_the_builder_is_found_through_the_registry():
    """A family registered at run time whose FlyDSLPath names an X-ray builder is X-rayed
    without any change to flyexplore.insight.xray: here a toy family reusing the RMSNorm builder."""
    from flyexplore.ops import FlyDSLPath, Operator, get_op, register_op, unregister_op

    rms = get_op("rmsnorm")
    toy = Operator(name="toy_xray_norm", doc="toy", dims=rms.dims, options=dict(rms.options), dtypes=rms.dtypes,
                   flydsl=FlyDSLPath(route="eager", path="toy", xray=rms.flydsl.xray, aten_ops=("toy_xray_norm",)))
    assert "toy_xray_norm" not in X.XRAY_DTYPES
    register_op(toy)
    try:
        assert X.XRAY_DTYPES["toy_xray_norm"] == X.XRAY_DTYPES["rmsnorm"]
        assert "toy_xray_norm" in X.coverage_text()
        x = X.xray("toy_xray_norm", "16x4096", "bf16")       # the explainer does not know it: torch decides
        assert not x.eligible and "needs M >= 8192 rows (got M=16)" in x.reason
        assert "_fused_rms_norm_cond" in x.verdict_source
    finally:
        unregister_op("toy_xray_norm")
    with pytest.raises(UsageError, match="unknown operator for xray 'toy_xray_norm'"):
        X.xray("toy_xray_norm", "16x4096", "bf16")


def test_no_op_names_in_the_xray_dispatch():
    """xray.py and the worker dispatch through the registry: no operator's name appears in
    their code (docstrings and comments aside)."""
    import ast
    import inspect

    from flyexplore.insight import _xray_worker as W
    from flyexplore.ops import list_ops

    for mod in (X, W):
        tree = ast.parse(inspect.getsource(mod))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        strings = [n.value for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
        for op in list_ops():
            assert op not in strings, (mod.__name__, op)


def test_coverage_lists_what_is_not_covered(capsys):
    assert main(["xray", "--coverage"]) == 0
    out = capsys.readouterr().out
    assert "grouped_gemm" in out and "sdpa" in out and "Not covered" in out


def test_cli_bad_op_exits_2(capsys):
    assert main(["xray", "--op", "conv", "--shape", "1x1"]) == 2
    assert "unknown operator for xray 'conv'" in capsys.readouterr().err


# ------------------------------------------------------------------ real compiles (one worker)
CASES = [
    ("rmsnorm", "8192x4096", "bf16"),
    ("rmsnorm", "8192x4096", "fp32"),
    ("rmsnorm", "4096x16384", "bf16"),
    ("rmsnorm", "4096x16384", "fp32"),
    ("rmsnorm", "16384x4096", "bf16"),      # same specialisation as 8192x4096 bf16: reused
    ("rmsnorm", "16x4096", "bf16"),         # outside torch's tuned region
    ("topk", "4096x4096x8", "fp32"),        # register kernel
    ("topk", "4096x4096x100", "fp32"),      # no kernel for K=100 at N=4096
    ("gemm", "4096x4096x4096", "bf16"),     # Inductor mm_flydsl baseline config
    ("gemm", "4096x4096x4096", "fp32"),     # FlyDSL GEMM takes fp16/bf16 only
]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    out = tmp_path_factory.mktemp("xray")
    t0 = time.perf_counter()
    res = X.xray_batch(CASES, out=str(out), use_explainer=False, cache=False)   # compiled here: reused, compile_s
    wall = time.perf_counter() - t0
    print(f"\nX-ray batch of {len(CASES)} cases: {wall:.1f} s wall; compile s: "
          + ", ".join(f"{x.case} {x.dtype} {k.compile_s:.2f}" for x in res for k in x.kernels if k.compile_s))
    return {(x.op, x.case, x.dtype): x for x in res}, out


def _meta(path, key):
    with open(path) as f:
        return int(re.search(r"^\s+\." + key + r":\s+(\d+)\s*$", f.read(), re.M).group(1))


@pytest.mark.slow
def test_rmsnorm_resources_come_from_the_real_isa(batch):
    res, out = batch
    for case in ("8192x4096", "4096x16384"):
        for dt in ("bf16", "fp32"):
            x = res[("rmsnorm", case, dt)]
            assert x.eligible and x.error is None and len(x.kernels) == 1, x.to_text()
            k = x.kernels[0]
            assert k.family == "rmsnorm fwd" and k.resources.target.endswith("gfx950")
            assert os.path.dirname(k.isa_file) == x.out_dir and k.isa_file.endswith(".s")
            with open(k.isa_file) as f:
                isa = f.read()
            assert '.amdgcn_target "amdgcn-amd-amdhsa--gfx950"' in isa.replace("-unknown-", "--")
            assert k.resources.vgprs_total == _meta(k.isa_file, "vgpr_count")
            assert k.resources.sgprs == _meta(k.isa_file, "sgpr_count")
            assert k.resources.lds_bytes == _meta(k.isa_file, "group_segment_fixed_size")
            assert k.resources.vgpr_spills == 0 and k.resources.scratch_bytes == 0
            assert k.instructions["vmem"] > 0 and k.instructions["lds"] > 0 and k.instructions["mfma"] == 0
            assert k.instructions["total"] > 100 and "buffer_load_dwordx4" in isa
            assert k.occupancy.waves_per_simd == 8          # these kernels are not register-bound
            assert json.load(open(os.path.join(x.out_dir, "xray.json")))["kernels"][0]["name"] == k.name


@pytest.mark.slow
def test_rmsnorm_numbers_differ_where_they_should(batch):
    res, _ = batch
    k = {(c, d): res[("rmsnorm", c, d)].kernels[0] for c in ("8192x4096", "4096x16384") for d in ("bf16", "fp32")}
    for dt in ("bf16", "fp32"):
        small, big = k[("8192x4096", dt)].resources, k[("4096x16384", dt)].resources
        # torch picks 256 threads below N=12288 and 512 from there (_forward_block_threads),
        # and the reduction buffer has one slot per wave.
        assert (small.workgroup_size, big.workgroup_size) == (256, 512)
        assert big.lds_bytes == 2 * small.lds_bytes > 0
        assert big.vgprs_total > small.vgprs_total
    for case in ("8192x4096", "4096x16384"):
        b, f = k[(case, "bf16")], k[(case, "fp32")]
        assert b.resources.vgprs_total != f.resources.vgprs_total
        assert b.instructions != f.instructions
    assert k[("8192x4096", "bf16")].config == {"N": 4096, "dtype": "bf16"}


@pytest.mark.slow
def test_same_specialisation_is_compiled_once(batch):
    res, _ = batch
    a, b = res[("rmsnorm", "8192x4096", "bf16")].kernels[0], res[("rmsnorm", "16384x4096", "bf16")].kernels[0]
    assert b.reused and not a.reused and a.resources == b.resources


@pytest.mark.slow
def test_not_eligible_cases_get_torchs_reason(batch):
    res, _ = batch
    x = res[("rmsnorm", "16x4096", "bf16")]
    assert not x.eligible and x.kernels == ()
    assert "needs M >= 8192 rows (got M=16)" in x.reason and "_fused_rms_norm_cond" in x.verdict_source
    x = res[("topk", "4096x4096x100", "fp32")]
    assert not x.eligible and "no FlyDSL TopK kernel for K=100, N=4096" in x.reason
    x = res[("gemm", "4096x4096x4096", "fp32")]
    assert not x.eligible and "fp16/bf16" in x.reason


@pytest.mark.slow
def test_topk_register_and_gemm_kernels(batch):
    res, _ = batch
    t = res[("topk", "4096x4096x8", "fp32")]
    assert t.eligible and [k.family for k in t.kernels] == ["topk register"], t.to_text()
    assert t.kernels[0].resources.workgroup_size == 128          # two 64-lane rows per workgroup
    g = res[("gemm", "4096x4096x4096", "bf16")]
    assert g.eligible and len(g.kernels) == 1, g.to_text()
    k = g.kernels[0]
    assert k.config["TILE_M"] == 128 and k.config["block_threads"] == k.resources.workgroup_size == 1024
    assert k.instructions["mfma"] > 0 and k.resources.lds_bytes == _meta(k.isa_file, "group_segment_fixed_size")
    assert any("eligible is not chosen" in n for n in g.notes)


@pytest.mark.slow
def test_frame_text_and_figure(batch, tmp_path):
    res, _ = batch
    df = X.xray_frame(list(res.values()))
    assert len(df) == len(CASES)
    assert set(df.loc[~df["eligible"], "kernel"].isna()) == {True}
    assert (df["source"] == "compiled").all()
    rms = df[(df["op"] == "rmsnorm") & df["eligible"]]
    fig = XV.resources_figure(rms)
    assert len(fig.data) == 2 * 4                                # dtypes x panels
    bf = [t for t in fig.data if t.name == "dtype=bf16" and t.yaxis == "y"][0]
    assert list(bf.x) == sorted(bf.x) and set(bf.y) == set(rms.loc[rms["dtype"] == "bf16", "vgprs_total"])
    fig.write_html(str(tmp_path / "fig.html"))
    assert (tmp_path / "fig.html").stat().st_size > 1000
    text = res[("rmsnorm", "8192x4096", "bf16")].to_text()
    assert "ELIGIBLE" in text and "waves per SIMD" in text and "sources in flyexplore.insight.xray.GFX950" in text
    with pytest.raises(UsageError, match="no compiled kernel"):
        XV.resources_figure(df[~df["eligible"]])


@pytest.mark.slow
def test_cli_xray_json(tmp_path, capsys):
    # the case of test_an_eligible_case_carries_the_explainers_verdict_and_is_compiled: one of the two
    # reads the other's compile from the session's X-ray cache (the JSON is the same either way)
    assert main(["xray", "--op", "rmsnorm", "--shape", "8192x4096", "--dtype", "fp16",
                 "--out", str(tmp_path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got) == 1 and got[0]["eligible"] and got[0]["kernels"][0]["config"] == {"N": 4096, "dtype": "f16"}
    isa = got[0]["kernels"][0]["isa_file"]
    assert os.path.exists(isa) and got[0]["kernels"][0]["resources"]["vgprs_total"] == _meta(isa, "vgpr_count")


def test_published_script_builds_its_case_list():
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "evidence", "xray_published.py")
    spec = importlib.util.spec_from_file_location("xray_published", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    req = mod.requests(radix=False, grouped=False)
    ops = [op for op, _, _ in req]
    assert (ops.count("rmsnorm"), ops.count("gemm"), ops.count("topk")) == (22, 15 + 17 + 17, 10)
    assert ("gemm", "32x4096x4096:NT", "mxfp4") in req and ("rmsnorm", "8192x4097", "fp16") in req
    with_all = mod.requests(radix=True, grouped=True)
    assert sum(op == "topk" for op, _, _ in with_all) == 33
    assert ("grouped_gemm", "8x512x2048x8192", "bf16") in with_all
    for op, shape, dtype in with_all:                  # every request is valid input for the X-ray
        X._request(op, shape, dtype)


@pytest.mark.parametrize("args, want", [
    (("rmsnorm", "8192x4096", "bf16"), ("rmsnorm", "8192x4096", "bf16")),
    (("scaled_gemm", "32x4096x4096", "mxfp4"), ("gemm", "32x4096x4096", "mxfp4")),
    (("grouped_gemm", "g8x512x4096x4096", "bf16"), ("grouped_gemm", "8x512x4096x4096", "bf16")),
    (("topk", "4096x2048x8", None), ("topk", "4096x2048x8", "fp32")),
])
def test_xray_request_maps_explainer_cases(args, want):
    req, note = X.xray_request(*args)
    assert req == want and note == ""


def test_xray_request_says_why_not(monkeypatch):
    req, why = X.xray_request("rmsnorm", "2048x4096", "bf16")
    assert req is None and "not eligible on gfx950" in why and "needs M >= 8192" in why
    req, note = X.xray_request("gemm", "16x28672x4096:NT", "bf16", "a_stride=4096,1")
    assert req == ("gemm", "16x28672x4096:NT", "bf16") and "compiles the contiguous case" in note
    monkeypatch.setattr(X, "unavailable_reason", lambda: "AMDGPU-capable ld.lld: no ld.lld found")
    req, why = X.xray_request("rmsnorm", "8192x4096", "bf16")
    assert req is None and "cannot run here: AMDGPU-capable ld.lld" in why
    from flyexplore.ui import notebooks as N
    note = N.xray_figure("rmsnorm", ["8192x4096"])
    assert isinstance(note, N.Note) and "no ld.lld found" in note._repr_markdown_()

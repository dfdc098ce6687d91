"""The operator checks (issue 11): inputs from public bug reports that the global-error checks
passed or failed wrongly, and property tests (hypothesis) that corrupted outputs are caught for
every operator family while ATen's own outputs pass, ties and NaN included."""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from conftest import examples  # noqa: E402
from hypothesis import strategies as st

from flyexplore.ops.scaled_gemm import mx
from flyexplore.results import table as R
from flyexplore.errors import UsageError
from flyexplore.ops import checks, get_op
from flyexplore.ops.base import RunContext
from flyexplore.ops.rmsnorm.operator import effective_eps
import flyexplore as fx

CPU = torch.device("cpu")
TOPK, RMS, GEMM = get_op("topk"), get_op("rmsnorm"), get_op("gemm")
GG, SG, ATT = get_op("grouped_gemm"), get_op("scaled_gemm"), get_op("attention")
FAST = settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _aten(op, case, dtype, inputs):
    bk = op.get_backend("aten")
    ctx = RunContext(CPU, None)
    with bk.context(ctx, case):
        return bk.build(case, dtype, inputs, ctx)()


def _check(op, text, dtype, inputs=None, seed=0):
    case = op.case(text)
    inputs = inputs or op.make_inputs(case, dtype, CPU, seed)
    return case, inputs, op.reference(case, dtype, inputs)


# -- TopK (pytorch/pytorch#193548: ties and NaN) ------------------------------------------------

def test_topk_indices_pointing_at_other_elements_fail():
    x = torch.randint(0, 4, (256, 1024), generator=torch.Generator().manual_seed(0)).float()
    case, inp, ref = _check(TOPK, "256x1024x8", "fp32", {"x": x})
    out = torch.topk(x, 8)
    good = TOPK.error(out, ref, case, "fp32")
    assert good["accuracy_ok"] and good["index_errors"] == 0
    zeros = (x == 0).float().topk(8).indices          # ATen's values, indices of zeros
    bad = TOPK.error((out.values, zeros), ref, case, "fp32")
    assert not bad["accuracy_ok"] and bad["index_errors"] == 256 * 8 and bad["err_rel"] == 0.0


def test_topk_duplicate_indices_and_out_of_order_values_fail():
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1))
    case, inp, ref = _check(TOPK, "64x512x16", "fp32", {"x": x})
    v, i = torch.topk(x, 16)
    dup = i.clone()
    dup[:, 3] = dup[:, 2]
    e = TOPK.error((v, dup), ref, case, "fp32")
    assert not e["accuracy_ok"] and e["index_errors"] >= 64
    e = TOPK.error((v.flip(-1), i.flip(-1)), ref, case, "fp32")      # sorted=True, wrong order
    assert not e["accuracy_ok"] and e["order_errors"] == 64 and e["index_errors"] == 0
    bad = i.clone()
    bad[7, 0] = 512                                                  # out of range
    assert TOPK.error((v, bad), ref, case, "fp32")["index_errors"] == 1


def test_topk_ties_are_reported_never_failed():
    x = torch.zeros(8, 64)
    x[:, :10] = 1.0                       # ten equal maxima for k=4: any four are right
    case, inp, ref = _check(TOPK, "8x64x4", "fp32", {"x": x})
    idx = torch.arange(6, 10).expand(8, 4).contiguous()          # the last four of the ties
    e = TOPK.error((torch.ones(8, 4), idx), ref, case, "fp32")
    assert e["accuracy_ok"] and e["tie_order_diffs"] > 0 and e["index_errors"] == 0
    case_u = TOPK.case("8x64x4:sorted=0")
    e = TOPK.error((torch.ones(8, 4), idx), TOPK.reference(case_u, "fp32", {"x": x}), case_u, "fp32")
    assert e["accuracy_ok"] and e["tie_order_diffs"] > 0 and e["index_errors"] == 0


def test_topk_nan_in_input_is_a_match_not_a_failure():
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(2))
    x[3, 7] = math.nan
    x[5] = math.nan
    x[6, 9] = math.inf
    for text in ("32x256x16", "32x256x16:largest=0", "32x256x16:sorted=0"):
        case, inp, ref = _check(TOPK, text, "fp32", {"x": x})
        e = TOPK.error(_aten(TOPK, case, "fp32", inp), ref, case, "fp32")
        assert e["accuracy_ok"], (text, e)
        assert math.isfinite(e["err_rel"])
    case, inp, ref = _check(TOPK, "32x256x16", "fp32", {"x": x})
    e = TOPK.error(torch.topk(x, 16), ref, case, "fp32")
    assert e["nonfinite_matched"] == 1 + 16 + 1
    v, i = torch.topk(x, 16)
    v = v.clone()
    v[0, 0] = math.nan                    # NaN where the reference is finite
    assert not TOPK.error((v, i), ref, case, "fp32")["accuracy_ok"]


# -- RMSNorm (pytorch/pytorch#155527: eps=None) --------------------------------------------------

def test_rmsnorm_eps_zero_with_zero_row_passes_for_aten():
    case = RMS.case("16x512:eps=0")
    inp = RMS.make_inputs(case, "fp32", CPU, 0)
    inp["x"][4] = 0.0
    ref = RMS.reference(case, "fp32", inp)
    e = RMS.error(_aten(RMS, case, "fp32", inp), ref, case, "fp32")
    assert e["accuracy_ok"] and e["nonfinite_matched"] == 512 and e["nonfinite_mismatch"] == 0
    assert math.isfinite(e["err_rel"])


def test_rmsnorm_one_wrong_row_fails_though_global_error_is_small():
    case, inp, ref = _check(RMS, "4096x256", "bf16")
    out = _aten(RMS, case, "bf16", inp).clone()
    out[100] = out[101]                               # one row of 4096 wrong
    e = RMS.error(out, ref, case, "bf16")
    assert e["err_rel"] < 0.03                        # within the old global tolerance (2e-2 bf16 ... nearly)
    assert not e["accuracy_ok"] and e["err_row_max_rel"] > 0.5 and e["err_fail_count"] > 200


def test_rmsnorm_eps_none_means_fp32_eps_everywhere(tmp_path):
    c = RMS.case("64x4096:eps=None")
    assert c["eps"] is None and c.label == "64x4096:eps=None"
    assert RMS.case("64x4096:eps=none")["eps"] is None
    assert effective_eps(c, "bf16") == torch.finfo(torch.float32).eps
    for dt in ("bf16", "fp16", "fp32"):
        inp = RMS.make_inputs(c, dt, CPU, 0)
        ref = RMS.reference(c, dt, inp)
        e = RMS.error(torch.nn.functional.rms_norm(inp["x"], (4096,), inp["w"], None), ref, c, dt)
        assert e["accuracy_ok"], (dt, e)
    with pytest.raises(UsageError, match="eps must be None or a finite number >= 0"):
        RMS.case("64x4096:eps=nan")
    df = fx.sweep("rmsnorm", shapes="8x4096:eps=None", dtypes="bf16", backends="aten",
                  out=tmp_path / "r.parquet", timer={"rep": 2, "warmup": 1}, progress=False)
    assert df["status"].tolist() == ["ok"] and bool(df["accuracy_ok"].iloc[0])
    assert R.load(tmp_path / "r.parquet")["case"].tolist() == ["8x4096:eps=None"]


# -- MX and FP8 (ROCm/aiter#974, pytorch/ao#4762) ------------------------------------------------

def _emulated(case, dtype, inp):
    bk = SG.get_backend("emulated")
    return bk.build(case, dtype, inp, RunContext(CPU, None))()


def test_mxfp4_doubled_scale_rows_fail_against_the_dequantized_product():
    case, inp, ref = _check(SG, "128x128x256", "mxfp4")
    good = SG.error(_emulated(case, "mxfp4", inp), ref, case, "mxfp4")
    assert good["accuracy_ok"] and good["err_rel_dequant"] < 0.01
    bad_inp = dict(inp)
    s = inp["a_s"].clone()
    s[:6] += 1                                 # six of 128 scale rows doubled (E8M0 byte + 1)
    bad_inp["a_s"] = s
    bad = SG.error(_emulated(case, "mxfp4", bad_inp), ref, case, "mxfp4")
    assert bad["err_rel_dequant"] > 0.15 and not bad["accuracy_ok"]
    assert bad["err_rel"] <= bad["err_tol"]    # the old rule (vs unquantized, per-format tol) passed it
    assert bad["err_row_max_rel"] > 0.9
    assert "against the dequantized product" in bad["accuracy_rule"]


def test_mxfp8_one_doubled_block_scale_of_b_fails():
    case, inp, ref = _check(SG, "64x96x128", "mxfp8")
    bad_inp = dict(inp)
    s = inp["b_s"].clone()
    s[17, 2] += 1                              # one 32-element block of B's row 17 doubled
    bad_inp["b_s"] = s
    e = SG.error(_emulated(case, "mxfp8", bad_inp), ref, case, "mxfp8")
    assert not e["accuracy_ok"] and e["err_fail_count"] > 0


def test_fp8_quantization_refuses_or_marks_non_finite_input():
    x = torch.randn(4, 64)
    x[1, 3] = math.inf
    for scaling in ("row", "tensor"):
        with pytest.raises(UsageError, match="1 non-finite value.*whole"):
            mx.quantize_fp8(x, scaling)
        q, s = mx.quantize_fp8(x, scaling, nonfinite="mark")
        d = mx.dequantize_fp8(q, s)
        assert torch.isnan(d).sum() == 1 and torch.isnan(d[1, 3])
        ok = torch.ones_like(x, dtype=torch.bool)
        ok[1, 3] = False
        assert torch.allclose(d[ok], x[ok], rtol=0.07, atol=0.02)    # the rest unharmed
    with pytest.raises(UsageError, match="nonfinite mode"):
        mx.quantize_fp8(x, "row", nonfinite="zero")


# -- GEMM, grouped GEMM, attention -------------------------------------------------------------

def test_gemm_and_grouped_gemm_wrong_row_or_group_fails():
    case, inp, ref = _check(GEMM, "256x128x512", "bf16")
    out = _aten(GEMM, case, "bf16", inp)
    assert GEMM.error(out, ref, case, "bf16")["accuracy_ok"]
    bad = out.clone()
    bad[200] = bad[201]
    e = GEMM.error(bad, ref, case, "bf16")
    assert not e["accuracy_ok"] and e["err_row_max_rel"] > 1.0 and e["err_block_max_rel"] > 0.2
    case, inp, ref = _check(GG, "4x96x128x256:ms=0/96/32/64", "bf16")
    out = _aten(GG, case, "bf16", inp)
    e = GG.error(out, ref, case, "bf16")
    assert e["accuracy_ok"] and e["err_block_max_rel"] < 0.01
    bad = out.clone()
    bad[96:128] *= -1                              # group 2 (rows 96..127) wrong
    e = GG.error(bad, ref, case, "bf16")
    assert not e["accuracy_ok"] and e["err_block_max_rel"] > 1.5
    assert "gamma_K" in e["accuracy_rule"] and "K=256" in e["accuracy_rule"]


@pytest.mark.parametrize("text,dtype", [("1x4x64x64x32:causal=1", "bf16"), ("1x4x64x96x32:hkv=2", "fp32"),
                                        ("1x4x32x32x16:causal=1,bwd", "fp32"), ("1x4x32x48x16:hkv=2,bwd", "bf16")])
def test_attention_aten_passes_and_a_wrong_query_row_fails(text, dtype):
    case, inp, ref = _check(ATT, text, dtype)
    for backend in ("math", "flash"):
        bk = ATT.get_backend(backend)
        ctx = RunContext(CPU, type("E", (), {"platform": "cpu"})())
        with bk.context(ctx, case):
            out = bk.build(case, dtype, inp, ctx)()
        e = ATT.error(out, ref, case, dtype)
        assert e["accuracy_ok"], (backend, e)
    if isinstance(out, tuple):
        bad = tuple(t.clone() for t in out)
        bad[0][0, 1, 5] = 0.0                     # one query's dq zeroed
        bad[2][0, 0, 3] *= 2                      # one key's dv doubled
    else:
        bad = out.clone()
        bad[0, 1, 5] = bad[0, 2, 5]               # one query row from another head
    assert not ATT.error(bad, ref, case, dtype)["accuracy_ok"]


def test_check_columns_are_one_block_after_accuracy_ok():
    cols = list(R.COLUMNS)
    i = cols.index("accuracy_ok")
    assert tuple(cols[i + 1:i + 1 + len(checks.CHECK_COLUMNS)]) == checks.CHECK_COLUMNS


# -- properties ---------------------------------------------------------------------------------

@FAST
@given(m=st.integers(1, 24), n=st.integers(8, 200), kfrac=st.floats(0.05, 1.0),
       levels=st.integers(2, 50), nan_rows=st.integers(0, 3), largest=st.booleans(),
       sorted_=st.booleans(), dtype=st.sampled_from(["fp32", "bf16", "fp16"]),
       seed=st.integers(0, 2 ** 16), corrupt=st.sampled_from(["dup", "permute", "other", "value"]))
def test_property_topk(m, n, kfrac, levels, nan_rows, largest, sorted_, dtype, seed, corrupt):
    """ATen's topk passes on inputs with many ties and NaN; a duplicated index, values out of
    order (sorted), an index pointing elsewhere, or a changed value fail."""
    k = max(1, int(n * kfrac))
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (m, n), generator=g).to(getattr(torch, {"fp32": "float32", "bf16": "bfloat16",
                                                                        "fp16": "float16"}[dtype]))
    for r in range(min(nan_rows, m)):
        x[r, torch.randint(0, n, (1,), generator=g)] = math.nan
    case = TOPK.make_case(m=m, n=n, k=k, largest=largest, sorted=sorted_)
    ref = TOPK.reference(case, dtype, {"x": x})
    v, i = _aten(TOPK, case, dtype, {"x": x})
    assert TOPK.error((v, i), ref, case, dtype)["accuracy_ok"]
    v, i = v.clone(), i.clone()
    r = int(torch.randint(0, m, (1,), generator=g))
    if corrupt == "dup" and k > 1:
        i[r, 1] = i[r, 0]
    elif corrupt == "permute" and sorted_ and k > 1:
        if torch.equal(v[r], v[r].flip(0)) or bool(torch.isnan(v[r]).all()):
            return                                # a row of equal values has no wrong order
        v[r], i[r] = v[r].flip(0), i[r].flip(0)
        if TOPK.error((v, i), ref, case, dtype)["accuracy_ok"]:
            # flipping equal-valued runs only is a tie-order difference: allowed
            assert bool((v[r] == v[r].flip(0)).all()) or bool(torch.isnan(v[r]).any())
            return
    elif corrupt == "other":
        used = set(i[r].tolist())
        val = v[r, 0]
        others = [j for j in range(n) if j not in used and not (x[r, j] == val or (x[r, j].isnan() and val.isnan()))]
        if not others:
            return
        i[r, 0] = others[0]
    else:
        v[r, 0] = v[r, 0] + 1 if not torch.isnan(v[r, 0]) else 0.0
    assert not TOPK.error((v, i), ref, case, dtype)["accuracy_ok"]


@FAST
@given(m=st.integers(1, 40), n=st.integers(1, 300), dtype=st.sampled_from(["fp32", "bf16", "fp16"]),
       eps=st.sampled_from([1e-6, 0.0, None]), zero_row=st.booleans(), seed=st.integers(0, 2 ** 16),
       weight=st.booleans())
def test_property_rmsnorm(m, n, dtype, eps, zero_row, seed, weight):
    """ATen's RMSNorm passes (eps=0 with a zero row gives NaN on both sides); one corrupted row
    (another row, or scaled by 1.5) fails."""
    case = RMS.make_case(m=m, n=n, eps=eps, weight=weight)
    inp = RMS.make_inputs(case, dtype, CPU, seed)
    if zero_row:
        inp["x"][0] = 0.0
    ref = RMS.reference(case, dtype, inp)
    out = _aten(RMS, case, dtype, inp)
    assert RMS.error(out, ref, case, dtype)["accuracy_ok"]
    r = m - 1
    if zero_row and r == 0:
        return
    bad = out.clone()
    bad[r] = bad[r] * 1.5
    if bool((bad[r] == out[r]).all()):
        return                                    # an all-zero output row cannot be scaled wrong
    assert not RMS.error(bad, ref, case, dtype)["accuracy_ok"]


def _corrupt_rows(out, rows, how, g):
    bad = out.clone()
    if how == "swap":
        other = bad[rows[1]].clone()
        bad[rows[0]] = other
    elif how == "double":
        bad[rows[0]] *= 2
    else:
        bad[rows[0], int(torch.randint(0, out.shape[-1], (1,), generator=g))] += 1.0 + out.abs().max()
    return bad


@FAST
@given(m=st.integers(2, 64), n=st.integers(1, 64), k=st.integers(1, 300), dtype=st.sampled_from(["fp32", "bf16", "fp16"]),
       layout=st.sampled_from(["NN", "NT", "TN", "TT"]), seed=st.integers(0, 2 ** 16),
       how=st.sampled_from(["swap", "double", "element"]), nan_row=st.booleans())
def test_property_gemm(m, n, k, dtype, layout, seed, how, nan_row):
    """ATen's GEMM passes (a NaN in A makes a NaN output row on both sides); a row swapped
    with another, doubled, or one element off fails."""
    case = GEMM.make_case(m=m, n=n, k=k, layout=layout)
    inp = GEMM.make_inputs(case, dtype, CPU, seed)
    if nan_row:
        inp["a"][0, 0] = math.nan
    ref = GEMM.reference(case, dtype, inp)
    out = _aten(GEMM, case, dtype, inp)
    e = GEMM.error(out, ref, case, dtype)
    assert e["accuracy_ok"] and e["nonfinite_matched"] == (n if nan_row else 0)
    g = torch.Generator().manual_seed(seed)
    rows = (1, 0) if nan_row else (0, 1)
    bad = _corrupt_rows(out, rows, how, g)
    if how == "swap" and not nan_row and torch.allclose(out[0].float(), out[1].float(), rtol=0.05, atol=0.05):
        return
    if how == "double" and float(out[rows[0]].abs().max()) < 1e-3:
        return
    assert not GEMM.error(bad, ref, case, dtype)["accuracy_ok"]


@FAST
@given(sizes=st.lists(st.integers(0, 24), min_size=1, max_size=5), n=st.sampled_from([8, 16, 40]),
       k=st.sampled_from([8, 24, 64]), dtype=st.sampled_from(["fp32", "bf16"]), seed=st.integers(0, 2 ** 16))
def test_property_grouped_gemm(sizes, n, k, dtype, seed):
    """ATen's grouped GEMM passes (empty groups included); one group negated fails."""
    if max(sizes) == 0:
        sizes[0] = 3
    case = GG.make_case(g=len(sizes), m=max(sizes), n=n, k=k, ms="/".join(map(str, sizes)))
    inp = GG.make_inputs(case, dtype, CPU, seed)
    ref = GG.reference(case, dtype, inp)
    out = _aten(GG, case, dtype, inp)
    assert GG.error(out, ref, case, dtype)["accuracy_ok"]
    gi = max(range(len(sizes)), key=lambda j: sizes[j])
    start = sum(sizes[:gi])
    bad = out.clone()
    bad[start:start + sizes[gi]] *= -1
    assert not GG.error(bad, ref, case, dtype)["accuracy_ok"]


@FAST
@given(m=st.sampled_from([32, 64, 96]), n=st.sampled_from([32, 64]), kb=st.integers(1, 4),
       dtype=st.sampled_from(["mxfp8", "mxfp4"]), side=st.sampled_from(["a", "b"]),
       seed=st.integers(0, 2 ** 16))
def test_property_scaled_gemm_doubled_scale(m, n, kb, dtype, side, seed):
    """The emulated MX GEMM passes against the dequantized product; one doubled block scale of
    A or B fails."""
    case = SG.make_case(m=m, n=n, k=32 * kb)
    inp = SG.make_inputs(case, dtype, CPU, seed)
    ref = SG.reference(case, dtype, inp)
    assert SG.error(_emulated(case, dtype, inp), ref, case, dtype)["accuracy_ok"]
    g = torch.Generator().manual_seed(seed)
    s = inp[f"{side}_s"].clone()
    r, b = int(torch.randint(0, s.shape[0], (1,), generator=g)), int(torch.randint(0, kb, (1,), generator=g))
    s[r, b] += 1
    bad = {**inp, f"{side}_s": s}
    assert not SG.error(_emulated(case, dtype, bad), ref, case, dtype)["accuracy_ok"]


@FAST
@given(b=st.integers(1, 2), hk=st.integers(1, 2), rep=st.integers(1, 2), sq=st.integers(1, 24),
       skv=st.integers(1, 24), d=st.sampled_from([8, 16]), dtype=st.sampled_from(["fp32", "bf16"]),
       causal=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_property_attention_forward(b, hk, rep, sq, skv, d, dtype, causal, seed):
    """SDPA (math backend) passes; one query row taken from another query fails."""
    if causal:
        skv = sq
    case = ATT.make_case(b=b, h=hk * rep, sq=sq, skv=skv, d=d, hkv=hk, causal=causal)
    inp = ATT.make_inputs(case, dtype, CPU, seed)
    ref = ATT.reference(case, dtype, inp)
    out = _aten_attention(case, dtype, inp)
    assert ATT.error(out, ref, case, dtype)["accuracy_ok"]
    bad = out.clone()
    bad[0, 0, 0] = -2 * bad[0, 0, 0] - 0.5          # far off for any row
    assert not ATT.error(bad, ref, case, dtype)["accuracy_ok"]


def _aten_attention(case, dtype, inp):
    bk = ATT.get_backend("math")
    ctx = RunContext(CPU, type("E", (), {"platform": "cpu"})())
    with bk.context(ctx, case):
        return bk.build(case, dtype, inp, ctx)()

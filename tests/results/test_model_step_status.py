"""Issue 44, parts 2 and 3: a variant whose logits failed the check is never ``ok`` in the step's
answer (its row keeps status ``ok`` with ``accuracy_ok`` false, as every family's), every variant
says what it does with CUDA/HIP graphs, and the answer says which variant a serving stack runs."""
from __future__ import annotations

import pandas as pd
import pytest

from flyexplore.results import model_step as MS
from flyexplore.views.model_step import MeasuredStep


def _rows(phase="decode", batch=32, bamba_ok=False):
    base = {"model": "llama-3.1-8b", "phase": phase, "batch": batch, "seq": 2048, "layers": 0, "dtype": "bf16",
            "device": "NVIDIA H100", "timing_mode": "event", "err_tol": 0.1, "rounds": 12}
    rows = [
        {**base, "backend": "eager", "status": "ok", "time_ms": 10.0, "time_ci_lo_ms": 9.9, "time_ci_hi_ms": 10.1,
         "baseline": "eager", "accuracy_ok": True, "err_rel": 0.0, "first_call_ms": 50.0,
         "state_restore_bytes": 21504.0, "state_restore": "decode rewind: 2 state tensor(s) and 2 position "
                                                         "counter(s) restored per call, 21.0 KiB copied"},
        {**base, "backend": "eager_graph", "status": "ok", "time_ms": 4.0, "time_ci_lo_ms": 3.9, "time_ci_hi_ms": 4.1,
         "baseline": "eager", "speedup": 2.5, "speedup_lo": 2.4, "speedup_hi": 2.6, "verdict": "FASTER",
         "accuracy_ok": bamba_ok, "err_rel": 0.0 if bamba_ok else 1.17, "first_call_ms": 900.0},
        {**base, "backend": "compile_graph", "status": "unavailable", "message": "CUDA/HIP graphs need a GPU"},
    ]
    return pd.DataFrame(rows)


def test_a_failed_check_shows_check_failed_with_its_error_never_ok():
    frame = _rows()
    s = MS.step_table(frame).set_index("variant")
    assert s.loc["eager", "status"] == "ok" and s.loc["eager_graph", "status"] == MS.CHECK_FAILED
    assert s.loc["eager_graph", "err_rel"] == pytest.approx(1.17)
    assert "check failed: logits err_rel 1.17 against eager's > tolerance 0.1" in s.loc["eager_graph", "note"]
    assert s.loc["eager_graph", "step_ms"] == 4.0              # measured: the time stays, labelled
    assert s.loc["compile_graph", "status"] == "unavailable"
    # a CSV reads accuracy_ok back as text: the same answer
    s2 = MS.step_table(frame.astype({"accuracy_ok": str})).set_index("variant")
    assert s2.loc["eager_graph", "status"] == MS.CHECK_FAILED and s2.loc["eager", "status"] == "ok"
    text = MeasuredStep(frame).text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("eager_graph"))
    assert "check failed" in line and " ok " not in f" {line} ", line
    assert MS.step_table(_rows(bamba_ok=True)).set_index("variant").loc["eager_graph", "status"] == "ok"


def test_a_flydsl_variant_that_failed_its_check_gives_no_measured_speedup():
    frame = _rows()
    frame.loc[1, "backend"] = "eager_flydsl"
    m = MS.flydsl_measured(frame, "eager")
    assert "speedup" not in m and m["reason"].startswith("eager_flydsl check failed"), m


def test_every_row_says_what_it_does_with_graphs_and_the_rewind_cost():
    frame = _rows(bamba_ok=True)
    s = MS.step_table(frame).set_index("variant")
    assert s.loc["eager", "graphs"].startswith("none:") and "graph replay" in s.loc["eager_graph", "graphs"]
    assert "graph trees" in s.loc["compile_graph", "graphs"] and s.loc["eager", "restore_bytes"] == 21504
    ms = MeasuredStep(frame)
    text = ms.text()
    assert "graphs" in text.splitlines()[2] and "21.0 KiB copied" in text
    d = ms.to_dict()
    assert d["cuda_graphs"]["eager_graph"] == s.loc["eager_graph", "graphs"] and d["serving"].startswith("serving:")


def test_the_serving_variant_of_each_phase():
    dec = MS.serving_variant("decode", 32, _rows(bamba_ok=True))
    assert dec["variants"][:2] == ["compile_graph", "eager_graph"] and dec["measured"] == ["eager_graph"]
    assert "vLLM" in dec["text"] and "SGLang" in dec["text"] and "512 by default" in dec["text"]
    assert "docs.vllm.ai/en/latest/design/cuda_graphs" in dec["text"] and "batch of 32" in dec["text"]
    # a graph variant whose check failed is not what serving runs
    assert MS.serving_variant("decode", 32, _rows())["measured"] == []
    pre = MS.serving_variant("prefill", 1, _rows(phase="prefill", batch=1))
    assert pre["variants"] == ["compile", "max_autotune", "eager"] and pre["measured"] == ["eager"]
    assert "without full CUDA/HIP graphs" in pre["text"] and "piecewise" in pre["text"]
    # a decode batch past what serving captures in graphs runs without them, as a prefill does
    big = MS.serving_variant("decode", 4096, _rows(bamba_ok=True))
    assert big["variants"] == ["compile", "max_autotune", "eager"] and big["measured"] == ["eager"]
    assert "past the largest batch serving stacks capture" in big["text"] and "(512)" in big["text"]
    assert MS.serving_variant("decode", 64, max_graph_batch=32)["variants"][0] == "compile"
    with pytest.raises(ValueError, match="unknown phase 'train'"):
        MS.serving_variant("train", 1)


def test_the_flydsl_pair_in_graphs_stands_beside_the_projection_where_asked():
    """The graph twins' FlyDSL pair is a second row of its view where one of them ran (here
    ``eager_graph`` ran and ``eager_flydsl_graph`` was not asked for: the row says so); a frame
    without graph variants keeps one row a view."""
    pv = MS.projection_vs_measured(_rows(bamba_ok=True), None)
    pairs = list(pv["measured_pair"])
    # compile_graph is no member of the compiled view's graph pair (max_autotune_flydsl_graph over
    # max_autotune_graph), so that view keeps one row
    assert pairs == ["eager_flydsl over eager", "eager_flydsl_graph over eager_graph",
                     "max_autotune_flydsl over max_autotune"]
    row = pv.set_index("measured_pair").loc["eager_flydsl_graph over eager_graph"]
    assert row["view"] == "eager" and row["reason"] == "eager_flydsl_graph was not among the variants asked for"
    plain = _rows(bamba_ok=True)
    plain = plain[~plain["backend"].str.endswith("_graph")]
    assert list(MS.projection_vs_measured(plain, None)["measured_pair"]) == [
        "eager_flydsl over eager", "max_autotune_flydsl over max_autotune"]

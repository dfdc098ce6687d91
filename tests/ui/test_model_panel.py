"""The model coverage panel driven from Python: set the controls, press Run, read what it shows.
Captures are real (a built-in Hugging Face config built with fake tensors, no weights, no GPU)."""
import pytest

import flyexplore as fx
from flyexplore.errors import UsageError
from flyexplore.insight.hf import builtin_models
from flyexplore.ui.model import CALL_COLUMNS, VIEW_CHOICES, ModelPanel


def test_controls_and_bad_initial_values():
    p = ModelPanel()
    assert fx.ModelPanel is ModelPanel
    assert [v for _, v in p.model.options] == list(builtin_models()) and p.model.value == "llama-3.1-8b"
    assert p.phase.options == ("prefill", "decode") and p.view.options == VIEW_CHOICES
    assert (p.batch.value, p.seq.value, p.view.value) == (1, 1024, "both")
    assert p.coverage is None and p.message.value == "" and p.widget.children
    with pytest.raises(UsageError, match=r"unknown built-in model 'gpt-5' \(valid: gpt-oss-20b,"):
        ModelPanel("gpt-5")
    with pytest.raises(UsageError, match=r"unknown phase 'train' \(valid: prefill, decode\)"):
        ModelPanel(phase="train")
    with pytest.raises(UsageError, match=r"unknown view 'fused'"):
        ModelPanel(view="fused")
    with pytest.raises(UsageError, match="seq must be a positive integer, got 0"):
        ModelPanel(seq=0)
    with pytest.raises(UsageError, match="bad arch 'gfx1'"):
        ModelPanel(arch="gfx1")


@pytest.mark.slow
def test_qwen3_moe_run_shows_the_expert_layout_finding_and_a_bad_seq_is_one_line():
    p = ModelPanel()
    p.model.value = "qwen3-30b-a3b"
    p.phase.value = "prefill"
    p.batch.value, p.seq.value = 1, 256
    cov = p.run()
    assert cov is p.coverage and cov is not None
    t = cov.table
    grouped = t[t["family"] == "grouped_gemm"]
    assert len(grouped) > 0 and set(grouped["status"]) == {"not eligible"}
    assert set(grouped["view"]) == {"eager", "compiled"}
    assert grouped[grouped["view"] == "compiled"]["reason"].str.contains(r"\[G, K, N\]", regex=True).all()
    assert any("[G, K, N]" in a["text"] for a in cov.advice)
    # what the panel shows: summary, judged calls, figure, advice, all from that coverage
    assert "qwen3-30b-a3b" in p.summary_view.value and "eligible time (modelled)" in p.summary_view.value
    calls = p.calls_frame(cov)
    assert list(calls.columns) == list(CALL_COLUMNS.values()) and len(calls) == int(t["family"].notna().sum())
    assert "_grouped_mm" in set(calls["op"]) and "_grouped_mm" in p.calls_view.value
    assert "[G, K, N]" in p.advice_view.value and "what-if" in p.message.value
    (out,) = p.figure_view.outputs
    fig = out["data"]["application/vnd.plotly.v1+json"]
    assert "modelled, not measured" in fig["layout"]["title"]["text"]
    assert {tr["name"] for tr in fig["data"]} >= {"eligible", "grouped_gemm: B contiguous"}
    assert "roofline on MI355X" in p.notes_view.value

    # bad input: one line of error text, no exception, nothing stale shown
    p.seq.value = 0
    assert p.run() is None
    assert "seq must be a positive integer, got 0" in p.message.value and "\n" not in p.message.value
    assert "Traceback" not in p.message.value and "#b42318" in p.message.value  # the error colour
    assert p.coverage is None and p.calls_view.value == "" and p.figure_view.outputs == ()
    assert not p.run_button.disabled

    # the button does what run() does; one view only
    p.seq.value, p.view.value = 128, "compiled"
    p.run_button.click()
    assert p.coverage is not None and set(p.coverage.table["view"]) == {"compiled"}
    assert "#1a7f37" in p.message.value

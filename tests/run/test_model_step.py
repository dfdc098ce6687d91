"""Issue 35 on the CPU: a real model step measured per variant (the ``model`` family), beside the
capture's modelled answer; bad input is one line, exit 2, nothing written; the family's sizes are
the published ones (an A-vs-A of the same variant: ``test_one_driver.py``)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

import flyexplore as fx
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.ops import get_op
from flyexplore.ops.base import RunContext
from flyexplore.ops.model import operator as M
from flyexplore.results import model_step as MS
from tests.cli.test_damaged_cli import one_line

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
        "torch_dtype": "float32"}
FAST_TIMER = {"min_rounds": 6, "max_rounds": 12}


def _cfg(tmp_path, cfg=TINY, name="tiny.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """``flyexplore model --measure`` of a 2-layer cut of a 3-layer Llama on the CPU: its exit code,
    its text and its result file."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("measure")
    cfg = _cfg(tmp)
    out = tmp / "rows.csv"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["model", "--config", str(cfg), "--seq", "64", "--batch", "2", "--layers", "2", "--measure",
                   "--measure-device", "cpu", "--out", str(out), "--report", str(tmp / "rep"), "--no-images"])
    return {"rc": rc, "text": buf.getvalue(), "out": out, "report": tmp / "rep" / "report.html"}


@pytest.mark.slow
def test_measure_on_the_cpu_gives_every_variant_a_row_and_a_breakdown_beside_the_model(measured):
    text, out = measured["text"], measured["out"]
    assert measured["rc"] == 0
    rows = pd.read_csv(out)
    by = rows.set_index("backend")
    assert list(rows["backend"]) == list(M.VARIANTS)               # every variant has a row
    assert by.loc["eager", "status"] == "ok" and by.loc["compile", "status"] == "ok"
    assert by.loc["max_autotune", "status"] == "unavailable" and "GPU" in by.loc["max_autotune", "message"]
    assert by.loc["eager_flydsl", "status"] == "unavailable" and "gfx950" in by.loc["eager_flydsl", "message"]
    assert by.loc["eager_ck", "status"] == "unavailable" and "ROCm" in by.loc["eager_ck", "message"]
    assert (rows["layers"] == 2).all() and (rows["op"] == "model").all()
    # the compiled variant's logits agree with eager's; its first call holds the compile
    assert bool(by.loc["compile", "accuracy_ok"]) and by.loc["compile", "err_rel"] < 1e-3
    assert by.loc["compile", "first_call_ms"] > 10 * by.loc["compile", "time_ms"]
    assert by.loc["compile", "verdict"] in ("FASTER", "SLOWER", "SAME", "AMBIGUOUS")
    assert by.loc["compile", "speedup_lo"] <= by.loc["compile", "speedup"] <= by.loc["compile", "speedup_hi"]
    bd = json.loads(by.loc["eager", "breakdown"])
    cats = {r["category"] for r in bd["rows"]}
    assert {"gemm", "attention", "rmsnorm"} <= cats, cats           # eager: the norm modules' ranges
    assert abs(sum(r["share"] for r in bd["rows"]) - 1) < 1e-6
    # the text: the measured table, the breakdown beside the modelled shares, the projection beside
    # the measured speedup, each labelled; the cut depth said
    assert "Measured step (measured on " in text and "first 2 layers only (--layers)" in text
    assert "what each variant does with CUDA/HIP graphs: its graphs column" in text
    assert "none: eager launches each kernel" in text and "CPU-op self times of one profiled step" in text
    assert by.loc["eager_graph", "status"] == "unavailable" and "need a GPU" in by.loc["eager_graph", "message"]
    assert "serving: prefill runs without full CUDA/HIP graphs" in text
    assert "beside the capture's modelled shares" in text and "modelled %" in text
    assert "projected (published MI355X per-op speedups through Amdahl's law, not a measurement)" in text
    assert "not measured: eager_flydsl unavailable" in text
    assert "layers: the first 2 of 3 decoder layers are built (--layers, layers=), as in the measured step" in text
    html = measured["report"].read_text()
    assert "Measured step" in html and "projected (not a measurement) beside measured" in html


@pytest.mark.slow
def test_the_measured_tables_say_what_each_number_is(measured):
    rows = fx.load(measured["out"])
    from flyexplore.results import table as R

    assert R.default_baseline(rows) == "eager"   # report / compare take the model's baseline, not aten
    steps = MS.step_table(rows)
    assert steps.attrs["kind"]["step_ms"] == "measured"
    e = steps.set_index("variant").loc["eager"]
    assert e["verdict"] == "baseline" and e["step_lo_ms"] <= e["step_ms"] <= e["step_hi_ms"]
    pv = MS.projection_vs_measured(rows, None)
    assert pv.attrs["kind"]["projected"] == "projection" and pv.attrs["kind"]["measured"] == "measured"
    assert pv["measured"].isna().all() and pv["reason"].str.contains("unavailable").all()
    chk = MS.breakdown_check(rows)
    assert set(chk["variant"]) == {"eager", "compile"} and (chk["profiled_ms"] > 0).all()


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    out = tmp_path / "rows.csv"
    base = ["model", "--config", str(cfg), "--seq", "64", "--measure", "--measure-device", "cpu", "--out", str(out)]
    one_line(capsys, main(base + ["--variants", "eager,turbo"]), "unknown --variants entry 'turbo'", "eager_flydsl")
    one_line(capsys, main(base + ["--seq", "513"]), "prefill at seq 513 needs 513 positions",
             "max_position_embeddings 512")
    one_line(capsys, main(base + ["--seq", "512", "--phase", "decode"]), "decode at seq 512 needs 513 positions")
    one_line(capsys, main(base + ["--max-memory", "100kB"]), "over the memory limit", "weights",
             "KV cache", "activations", "max_memory (--max-memory) 100.0 kB")
    one_line(capsys, main(base + ["--layers", "9"]), "layers=9 is past the 3 layers")
    one_line(capsys, main(["model", "--config", str(cfg), "--variants", "eager"]), "--variants is for --measure")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["tiny.json"]


def test_seq_512_prefill_fits_exactly(tmp_path, capsys):
    """The position check's edge: a prefill of max_position_embeddings tokens is a valid case."""
    op = get_op("model")
    assert op.case(f"1x512:model={_cfg(tmp_path)}")["seq"] == 512


def test_a_model_over_free_memory_is_refused_naming_the_estimate(monkeypatch, tmp_path):
    """Llama-3.1-8B in bf16 on a machine with 8 GB free: refused before anything is allocated, the
    message naming the estimate (16 GB of weights)."""
    from flyexplore.run import memory as MEM

    monkeypatch.setattr(MEM, "free_memory", lambda dev: (8 * 10 ** 9, "MemAvailable, /proc/meminfo"))
    with pytest.raises(UsageError) as e:
        fx.model("llama-3.1-8b", measure=True, seq=2048, measure_device="cpu", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "weights 16.06 GB" in msg and "the device's free memory 8.0 GB" in msg, msg


def test_sizes_are_the_published_ones():
    """:func:`model_dims` against the model cards: Llama-3.1-8B has 8.03B parameters; Qwen3-30B-A3B
    30.5B in all, 3.3B activated (huggingface.co/Qwen/Qwen3-30B-A3B: "30.5B in total and 3.3B
    activated"); Mixtral-8x7B 46.7B in all, 12.9B active (mistral.ai, "Mixtral of experts")."""
    d = {n: M.model_dims(M.describe(n)["config"]) for n in ("llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b")}
    assert d["llama-3.1-8b"]["params"] == pytest.approx(8.03e9, rel=0.01)
    assert d["qwen3-30b-a3b"]["params"] == pytest.approx(30.5e9, rel=0.01)
    # the published "activated" counts the input embedding too, which no GEMM reads
    emb = {n: x["vocab"] * x["hidden"] for n, x in d.items()}
    assert d["qwen3-30b-a3b"]["active"] + emb["qwen3-30b-a3b"] == pytest.approx(3.3e9, rel=0.03)
    assert d["mixtral-8x7b"]["params"] == pytest.approx(46.7e9, rel=0.01)
    assert d["mixtral-8x7b"]["active"] + emb["mixtral-8x7b"] == pytest.approx(12.9e9, rel=0.03)
    op = get_op("model")
    t = M.memory_terms(op.case("32x2048:model=llama-3.1-8b,decode"), "bf16")
    assert t["kv_cache"] == 2 * 32 * 32 * 8 * 2049 * 128 * 2      # K and V, layers, batch, KV heads, positions, dim


def test_decode_repeats_exactly_and_layers_cut_the_depth(tmp_path):
    """A decode call writes the same cache slot each time (the static cache is put back to the
    context): two calls give the same logits, and the cache's position stays at the context."""
    import torch

    op = get_op("model")
    case = op.case(f"3x40:model={_cfg(tmp_path)},decode,layers=2")
    inputs = op.make_inputs(case, "fp32", "cpu", 0)
    assert len(inputs["model"].model.layers) == 2
    step = op.get_backend("eager").build(case, "fp32", inputs, RunContext(torch.device("cpu"), None))
    a, b = M.logits(step()), M.logits(step())
    assert a.shape == (3, 1, 256) and torch.equal(a, b)
    cache = inputs["kwargs"].get("cache", inputs["kwargs"].get("past_key_values"))
    assert {int(layer.cumulative_length) for layer in cache.layers} == {41}   # 40 of context + the new token
    ref = op.reference(case, "fp32", inputs)
    assert op.error(step(), ref, case, "fp32")["accuracy_ok"]


# An A-vs-A of one variant (two worker processes taking turns) never reads FASTER or SLOWER:
# tests/run/test_one_driver.py::test_a_vs_a_of_one_model_step_never_reads_faster_or_slower, on the
# A/A of a prefill and a decode step that the tests there run anyway.


@pytest.mark.slow
def test_an_nn_module_is_measured_with_its_own_inputs():
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    cov = fx.model(MLP(), torch.randn(32, 64), measure=True, variants="eager,compile", measure_device="cpu",
                   timer=FAST_TIMER, progress=False)
    s = cov.measured.steps().set_index("variant")
    assert list(s.index) == ["eager", "compile"] and (s["status"] == "ok").all()
    assert (s["dtype"] == "fp32").all() and "MLP (an nn.Module) on its own inputs and weights" in cov.text()
    assert "Measured step" in cov.text() and cov.to_dict()["measured"]["steps"][0]["variant"] == "eager"


def test_the_memory_check_takes_the_familys_own_estimate_and_runs_no_probe(tmp_path):
    from flyexplore.run.memory import memory_check
    from flyexplore.run.plan import make_plan

    plan = make_plan("model", shapes="32x2048:model=llama-3.1-8b,decode", dtypes="bf16")
    check = memory_check(plan, "cpu", max_memory=10 ** 12, reader=lambda dev: (None, "not read"),
                         measure=lambda *a: pytest.fail("a probe ran"))
    est = check.estimates[("32x2048:model=llama-3.1-8b,decode", "bf16")]
    assert est.source == "family" and "weights 16.06 GB + KV cache 8.59 GB" in est.terms


def test_a_long_cpu_measurement_says_so_before_it_starts(monkeypatch, capsys):
    """Llama-3.1-8B dims cut to one layer, prefill 1x2048 on the CPU: about a TFLOP a step, so the
    note comes before the sweep starts (here the sweep is stopped as it would begin)."""
    from flyexplore.views import model_step as VS

    class Began(Exception):
        pass

    def begin(spec, progress=True):
        raise Began

    monkeypatch.setattr(VS, "run_sweep", begin)
    with pytest.raises(Began):
        VS.measure_model("llama-3.1-8b", seq=2048, layers=1, device="cpu", variants="eager", say=True)
    err = capsys.readouterr().err
    assert "flyexplore: note: one step is 0.93 TFLOP: on this CPU about 19 s a step" in err, err
    assert err.index("one step is") < err.index("layers: the first 1 of 32")   # before the capture

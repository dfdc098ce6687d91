"""vLLM whole-request A/B from `vllm bench serve --save-result` JSON (synthetic files with the
field names vllm/benchmarks/serve.py writes)."""
import json

import pytest

from flyexplore.results import vllm as V
from flyexplore.errors import UsageError


def result(model="meta-llama/Llama-3.1-8B-Instruct", conc=16, ttft=50.0, tpot=12.0, itl=11.0, rps=3.0,
           tok=1500.0):
    """One saved result object as vllm bench serve writes it (setup merged with metrics)."""
    return {"date": "20261129-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
            "model_id": model, "tokenizer_id": model, "num_prompts": 256, "request_rate": "inf",
            "burstiness": 1.0, "max_concurrency": conc, "duration": 80.0, "completed": 256, "failed": 0,
            "total_input_tokens": 65536, "total_output_tokens": 131072, "request_throughput": rps,
            "request_goodput": None, "output_throughput": tok, "total_token_throughput": tok * 1.5,
            "max_output_tokens_per_s": tok * 1.2, "max_concurrent_requests": conc, "rtfx": 0.0,
            "mean_ttft_ms": ttft * 1.1, "median_ttft_ms": ttft, "std_ttft_ms": 3.0, "p99_ttft_ms": ttft * 2,
            "mean_tpot_ms": tpot, "median_tpot_ms": tpot, "std_tpot_ms": 0.5, "p99_tpot_ms": tpot * 1.3,
            "mean_itl_ms": itl, "median_itl_ms": itl, "std_itl_ms": 0.4, "p99_itl_ms": itl * 2}


def write(path, *objs, append=False):
    if append:  # --append-result: one object per line
        path.write_text("\n".join(json.dumps(o) for o in objs))
    else:
        path.write_text(json.dumps(objs[0]))
    return path


def test_load_single_and_appended_files(tmp_path):
    write(tmp_path / "a.json", result(conc=8))
    write(tmp_path / "b.json", result(conc=16), result(conc=32), append=True)
    (tmp_path / "a.pytorch.json").write_text("[]")  # vllm's side file is skipped
    runs = V.load_runs(tmp_path)
    assert sorted(runs["concurrency"]) == [8, 16, 32]
    assert set(runs["model"]) == {"Llama-3.1-8B-Instruct"}
    assert runs["median_ttft_ms"].iloc[0] == 50.0 and "p99_itl_ms" in runs


def test_ab_table_direction_and_only_lists(tmp_path):
    a = tmp_path / "off"
    b = tmp_path / "on"
    a.mkdir()
    b.mkdir()
    write(a / "c16.json", result(conc=16, ttft=60.0, tpot=12.0, rps=3.0))
    write(a / "c64.json", result(conc=64))
    write(b / "c16.json", result(conc=16, ttft=40.0, tpot=15.0, rps=3.3))
    write(b / "c32.json", result(conc=32))
    ab = V.ab_table(V.load_runs(a), V.load_runs(b), names=("off", "on"))
    s = ab.set_index("metric")["speedup"]
    assert s["median_ttft_ms"] == pytest.approx(60 / 40)       # latency: A/B
    assert s["median_tpot_ms"] == pytest.approx(12 / 15)       # slower TPOT -> < 1
    assert s["request_throughput"] == pytest.approx(3.3 / 3.0)  # throughput: B/A
    assert set(ab["concurrency"]) == {16}
    assert ab.attrs["only_a"] == ["Llama-3.1-8B-Instruct c=64 rate=inf"]
    assert ab.attrs["only_b"] == ["Llama-3.1-8B-Instruct c=32 rate=inf"]
    assert set(ab["a"]) == {"off"} and set(ab["source"]) == {"measured"}


def test_repeated_runs_are_reduced_to_the_median(tmp_path):
    a = [write(tmp_path / f"a{i}.json", result(ttft=t)) for i, t in enumerate((40.0, 50.0, 90.0))]
    b = [write(tmp_path / "b.json", result(ttft=25.0))]
    ab = V.ab_table(V.load_runs(a), V.load_runs(b))
    assert ab.set_index("metric").loc["median_ttft_ms", "a_value"] == 50.0


def test_bad_inputs(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        V.load_runs(tmp_path / "missing.json")
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(UsageError, match="not a vllm bench serve --save-result file"):
        V.load_runs(bad)
    assert not V.looks_like_vllm(bad)
    assert V.looks_like_vllm(write(tmp_path / "ok.json", result()))
    other = write(tmp_path / "o.json", result(model="Qwen/Qwen3-32B"))
    with pytest.raises(UsageError, match="no .model, concurrency, request rate. in both arms"):
        V.ab_table(V.load_runs(tmp_path / "ok.json"), V.load_runs(other))


def test_synthetic_example_files_are_labelled_as_such(tmp_path):
    """The shipped example files (data/examples/vllm) are made up: every run says so, and an A/B
    of them is tagged source="synthetic example", never "measured"."""
    from flyexplore.paths import data_dir

    ex = data_dir() / "examples" / "vllm"
    off, on = V.load_runs(ex / "flydsl_off"), V.load_runs(ex / "flydsl_on")
    assert len(off) == len(on) == 3 and sorted(off["concurrency"]) == [8, 32, 128]
    assert off[V.SYNTHETIC_FIELD].str.contains("not a measurement").all() and set(on["label"]) == {"synthetic example"}
    ab = V.ab_table(off, on, names=("FlyDSL off", "FlyDSL on"))
    assert set(ab["source"]) == {"synthetic example"} and len(ab) == 3 * len(V.METRICS)
    ttft = ab[(ab["metric"] == "median_ttft_ms") & (ab["concurrency"] == 32)]["speedup"].item()
    assert ttft == pytest.approx(95.0 / 90.0)
    # a marked file on one side is enough; unmarked files stay "measured"; an explicit source wins
    write(tmp_path / "real.json", result(model="example/synthetic-model", conc=8))
    assert set(V.ab_table(V.load_runs(tmp_path / "real.json"), on)["source"]) == {"synthetic example"}
    write(tmp_path / "real2.json", result(model="example/synthetic-model", conc=8))
    assert set(V.ab_table(V.load_runs(tmp_path / "real.json"), V.load_runs(tmp_path / "real2.json"))["source"]) \
        == {"measured"}
    assert set(V.ab_table(off, on, source="measured elsewhere")["source"]) == {"measured elsewhere"}

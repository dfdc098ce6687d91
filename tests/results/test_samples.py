"""Each row's samples parsed once (flyexplore.results.samples): the batch parser (pyarrow's JSON
reader, numpy statistics for all rows of one length at once) gives exactly what the scalar
functions give (timing.rounds_from_json, stats.round_values, median_ci, drift) on any list of
rounds, damaged texts raise what they raised, and the cache keeps each text once, within its bound."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from conftest import examples  # noqa: E402
from hypothesis import strategies as st

from flyexplore.measure import stats as S
from flyexplore.measure import timing
from flyexplore.results import samples as SP


def _want(text) -> SP.Parsed:
    r = timing.rounds_from_json(text)
    return SP.summarize(len(r), S.round_values(r))


def _equal(a: SP.Parsed, b: SP.Parsed) -> bool:
    same = [x == y or (math.isnan(x) and math.isnan(y))
            for x, y in ((a.median, b.median), (a.lo, b.lo), (a.hi, b.hi), (a.drift, b.drift))]
    return a.rounds == b.rounds and np.array_equal(a.values, b.values, equal_nan=True) and all(same)


_value = st.one_of(st.floats(1e-4, 1e3), st.sampled_from([0.0, 1.0, 2.5]))
_round = st.lists(_value, min_size=0, max_size=6)


@settings(max_examples=examples(60), deadline=None, database=None)
@given(rows=st.lists(st.lists(_round, min_size=0, max_size=40), min_size=1, max_size=30))
def test_the_batch_gives_what_the_scalar_functions_give(rows):
    texts = [timing.samples_json(r) for r in rows]
    SP.clear_cache()
    got = SP.parse(texts)
    assert all(_equal(g, _want(t)) for g, t in zip(got, texts))


def test_rows_of_many_lengths_rounds_of_many_lengths_and_odd_values():
    rng = np.random.default_rng(3)
    texts = []
    for _ in range(400):   # the statistics of all rows of one length go as one array
        calls = int(rng.integers(1, 6))
        rounds = [[float(v) for v in rng.lognormal(0, 0.2, calls if rng.random() < 0.9 else int(rng.integers(0, 5)))]
                  for _ in range(int(rng.integers(0, 60)))]
        texts.append(json.dumps(rounds))
    texts += ["", None, float("nan"), "[]", "[[]]", "[[], []]", "[[1,2],[3]]", "[[NaN, 1.0]]", "[[Infinity],[1.0]]",
              "[[1.0]\n,[2.0]]", "[[0.0],[0.0],[0.0],[0.0],[1],[2],[3],[4],[5]]", "[[5,5,5,5,5,5,5,5]]"]
    SP.clear_cache()
    got = SP.parse(texts)
    for g, t in zip(got, texts):
        assert _equal(g, _want(t)), t
    assert got[texts.index("")] is SP.EMPTY and got[texts.index(None)] is SP.EMPTY
    assert got[-2].drift == math.inf   # a part whose median is 0: infinitely far, as stats.drift says


@pytest.mark.parametrize("text", ["[1, 2]", "[[1, \"a\"]]", "{\"a\": 1}", "[[1.0], [2.0", "null", "[[null]]"])
def test_a_damaged_text_raises_what_the_json_reader_raised(text):
    with pytest.raises(Exception) as old:
        timing.rounds_from_json(text)
    SP.clear_cache()
    good = timing.samples_json([[1.0, 2.0], [3.0]])
    with pytest.raises(type(old.value)):
        SP.parse([good, text])


def test_each_text_is_parsed_once_and_the_cache_stays_within_its_bound(monkeypatch):
    SP.clear_cache()
    calls = []
    many = SP._parse_many
    monkeypatch.setattr(SP, "_parse_many", lambda texts: calls.append(list(texts)) or many(texts))
    a, b = timing.samples_json([[1.0], [2.0]]), timing.samples_json([[3.0], [4.0]])
    first = SP.parse([a, b, a])
    assert calls == [[a, b]] and first[0] is first[2]
    again = SP.parse([b, a])
    assert calls == [[a, b]] and again[1] is first[0]   # found, not parsed again
    # past the bound the oldest texts go first
    SP.clear_cache()
    monkeypatch.setattr(SP, "CACHE_BYTES", 3 * (len(a) + 8 * 2 + 200))
    texts = [timing.samples_json([[float(i)], [float(i + 1)]]) for i in range(10)]
    SP.parse(texts)
    assert len(SP._cache) <= 3 and texts[-1] in SP._cache and texts[0] not in SP._cache
    assert SP._cache_bytes[0] <= SP.CACHE_BYTES


def test_the_scale_benchmark_copies_rows_with_samples_of_their_own():
    """benchmarks/evidence/analysis_scale.py times the parser without its cache's help: every copy of a row
    gets its own samples text (its first sample nudged), the statistics barely move."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("analysis_scale", ROOT / "benchmarks" / "evidence" / "analysis_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    src = bench.source()
    df = bench.replicate(src, 3 * len(src) + 5)
    assert len(df) == 3 * len(src) + 5 and not df.duplicated(["op", "case", "dtype", "backend"]).any()
    texts = df["samples_ms"].dropna()
    assert texts.is_unique and len(texts) == 3 * src["samples_ms"].notna().sum() + df["samples_ms"].iloc[-5:].notna().sum()
    first = src["samples_ms"].dropna().tolist()
    copy = texts.tolist()[:len(first)]          # copy 0 of each row, nudged
    assert not set(first) & set(copy)
    assert all(abs(p.median / q.median - 1) < 1e-5 for p, q in zip(SP.parse(first), SP.parse(copy)))


@pytest.mark.parametrize("dtype", ["string[pyarrow]", "string[python]", object])
def test_parse_column_reads_rows_in_any_order_from_any_column(dtype, monkeypatch):
    """parse_column takes the texts out COLUMN_ROWS rows at a time, chunk by chunk for an arrow
    column of many chunks (a concatenation), and gives parse()'s records in the order asked."""
    import pandas as pd

    monkeypatch.setattr(SP, "COLUMN_ROWS", 7)
    texts = [timing.samples_json([[float(i), float(i) + 0.5], [float(i) + 1.0, float(i)]]) for i in range(40)]
    texts[5] = None
    parts = [pd.Series(texts[k:k + 9], dtype=dtype) for k in range(0, 40, 9)]
    col = pd.concat(parts, ignore_index=True)
    at = np.asarray([39, 0, 5, 17, 17, 3, 38, 9, 8, 26, 1])
    SP.clear_cache()
    got = SP.parse_column(col, at)
    assert [g.rounds for g in got] == [0 if texts[k] is None else 2 for k in at]
    for g, k in zip(got, at):
        assert _equal(g, _want(texts[k]) if texts[k] is not None else SP.EMPTY)


def test_a_column_changed_after_a_parse_is_parsed_anew_not_read_from_the_memo():
    """The memo of arrow chunks never answers for text it did not parse: a cell assigned, a row
    dropped, a frame concatenated or a column rebuilt from the same texts each give the records of
    the text now there (a second call on an unchanged column reads the memo: nothing parsed)."""
    import pandas as pd

    texts = [timing.samples_json([[float(i), float(i) + 0.5]]) for i in range(1, 21)]
    df = pd.DataFrame({"samples_ms": pd.Series(texts, dtype="string[pyarrow]")})
    SP.clear_cache()
    at = np.arange(20)
    first = SP.parse_column(df["samples_ms"], at)
    assert [p.median for p in first] == [i + 0.25 for i in range(1, 21)]
    calls = []
    real = SP._parse_many
    SP._parse_many = lambda t: calls.append(len(t)) or real(t)
    try:
        again = SP.parse_column(df["samples_ms"], at)
        assert calls == [] and all(a is b for a, b in zip(again, first))
        df.loc[3, "samples_ms"] = timing.samples_json([[100.0, 102.0]])
        assert SP.parse_column(df["samples_ms"], at)[3].median == 101.0
        assert SP.parse_column(df["samples_ms"].iloc[1:].reset_index(drop=True), np.asarray([2]))[0].median == 101.0
        both = pd.concat([df, df], ignore_index=True)["samples_ms"]
        assert [p.median for p in SP.parse_column(both, np.asarray([3, 23, 0]))] == [101.0, 101.0, 1.25]
        fresh = pd.Series(list(df["samples_ms"]), dtype="string[pyarrow]")
        assert SP.parse_column(fresh, np.asarray([3]))[0].median == 101.0
    finally:
        SP._parse_many = real
    assert calls == [1]   # the new text, once (the text cache answers for it after)

"""Analysis at the speed of the data, held by a ratio: ``fx.speedup`` and ``fx.geomean`` on
10,000 result rows against a plain-pandas reference doing the medians, the merge against the
baseline and the geometric means (``benchmarks/evidence/analysis_scale.py``'s ``reference`` and
``reference_geomean``), timed in this process, in alternation, on the same frame.

The frame is what a sweep hands back: the committed CPU sweeps' rows copied over distinct cases
up to 10,000 rows (the benchmark's ``sweep_like``), normalized, with the sweep record a sweep
keeps in ``attrs["sweeps"]`` (its plan lists every case). pandas deep-copies ``attrs`` into
every operation's result, so the reference pays for it as any pandas code on such a frame
does; flyexplore's rules read rows and must not.

Issue 47's goal, 0.35x, is wall time at rest: the benchmark measures it (``analysis_scale.py``,
``data/bench/analysis_scale.txt``). This test is its guard against a regression, on CPU time
(``time.process_time``: time spent waiting for a core is not counted) with the bound twice the
goal: under load the rules' numpy and arrow work slows more than the reference's pure-Python
copies (measured here: 0.29x at rest, up to 0.54x wall at load 6 beside the suite). The 4x
regression the issue found (0.85x) fails it.
"""
from __future__ import annotations

import importlib.util
import time

import pytest

import flyexplore as fx
from flyexplore.results import samples as SP

from conftest import ROOT

pytestmark = pytest.mark.slow   # 10,000 rows' samples (59 MB) parsed twice: about 8 s on 2 cores

#: The goal of issue 47: fx.speedup + fx.geomean on 10,000 rows in at most this fraction of the
#: plain-pandas reference's time (wall, at rest: the benchmark's figure).
GOAL = 0.35
#: What this test holds, on CPU time and whatever the load: twice the goal.
GUARD = 2 * GOAL


def _bench():
    spec = importlib.util.spec_from_file_location("analysis_scale", ROOT / "benchmarks" / "evidence" / "analysis_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rows():
    """10,000 normalized rows with a sweep's ``attrs["sweeps"]`` listing each of their cases."""
    A = _bench()
    return A, A.sweep_like(10000)


def test_speedup_and_geomean_of_10k_rows_take_a_fraction_of_plain_pandas(rows):
    A, df = rows
    ours, ref = A.fx_ratio(df, rounds=5, clock=time.process_time)
    assert ours / ref <= GUARD, f"fx.speedup + fx.geomean {ours:.3f} s, plain pandas {ref:.3f} s: {ours / ref:.2f}x"


def test_the_rules_give_the_same_answers_with_and_without_attrs(rows):
    """What makes them fast changes no answer: the frame without its attrs, and the samples parsed
    afresh (the memo of arrow chunks and the text cache emptied), give identical frames."""
    import pandas as pd

    _, df = rows
    a, g = fx.speedup(df, "aten"), fx.geomean(df, "aten")
    bare = df.copy()
    bare.attrs = {}
    SP.clear_cache()
    pd.testing.assert_frame_equal(a, fx.speedup(bare, "aten"))
    pd.testing.assert_frame_equal(g, fx.geomean(bare, "aten"))
    assert df.attrs["sweeps"][0]["plan"]["cases"][0] == df["case"].iloc[0] + " " + df["dtype"].iloc[0]
    assert not a.attrs and len(a) == 4118 and set(a["interval"]) == {"paired"}

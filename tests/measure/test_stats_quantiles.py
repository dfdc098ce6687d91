"""The normal and Student-t quantiles of :mod:`flyexplore.measure.stats` come from
``scipy.special`` (``ndtri``, ``stdtrit``): the values ``scipy.stats.norm.ppf`` and
``scipy.stats.t.ppf`` give, without importing ``scipy.stats`` (0.7 s in each process that draws
its first figure or compares two runs)."""
import subprocess
import sys

import pytest
from scipy import stats as st

from flyexplore.measure import stats as S


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99, 0.9875])
def test_the_quantiles_are_scipy_stats_own(confidence):
    for df in (0.5, 1, 1.7, 2, 3, 4.4, 7, 10, 29.3, 100, 1e4):
        assert S.t_quantile(df, confidence) == float(st.t.ppf(0.5 + confidence / 2, df)), df
    z = float(st.norm.ppf(0.5 + confidence / 2))
    est, lo, hi = S.geomean_ci([1.2, 0.9], [1.1, 0.8], [1.3, 1.0], confidence)
    se = ((S.np.log(1.3) - S.np.log(1.1)) ** 2 + (S.np.log(1.0) - S.np.log(0.8)) ** 2) ** 0.5 / (2 * z) / 2
    assert lo == pytest.approx(est * S.np.exp(-z * se), rel=1e-12)
    assert hi == pytest.approx(est * S.np.exp(z * se), rel=1e-12)


def test_a_geomean_and_a_t_interval_do_not_import_scipy_stats():
    code = ("import sys; from flyexplore.measure import stats as S; "
            "S.geomean_ci([1.2], [1.1], [1.3]); S.t_quantile(3.5); "
            "print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr

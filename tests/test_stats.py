import math
import random

import pytest

from leadline import stats

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("df", [1, 2, 3, 5, 10, 30, 120, 1000])
@pytest.mark.parametrize("p", [0.6, 0.9, 0.95, 0.975, 0.99, 0.999, 0.025])
def test_t_quantile_matches_scipy(p, df):
    assert stats.t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9, abs=1e-10)


@pytest.mark.parametrize("t", [-5.0, -1.3, 0.0, 0.4, 2.1, 7.0])
@pytest.mark.parametrize("df", [1, 4, 29])
def test_t_cdf_matches_scipy(t, df):
    assert stats.t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), rel=1e-10, abs=1e-13)


def test_known_table_values():
    # Student's table: t_{0.975, 10} = 2.228, t_{0.95, 1} = 6.314
    assert stats.t_quantile(0.975, 10) == pytest.approx(2.2281388519649385, rel=1e-9)
    assert stats.t_quantile(0.95, 1) == pytest.approx(6.313751514675043, rel=1e-9)


def test_paired_difference_matches_scipy_ttest_rel():
    rng = random.Random(3)
    a = [rng.gauss(1.0, 0.3) for _ in range(40)]
    b = [x + rng.gauss(0.1, 0.1) for x in a]
    d = stats.paired_difference(a, b)
    ref = scipy_stats.ttest_rel(a, b)
    assert d.t == pytest.approx(ref.statistic, rel=1e-10)
    assert d.p_two_sided == pytest.approx(ref.pvalue, rel=1e-8)
    assert d.mean < 0 and d.p_less < 0.05
    assert d.ci_low < d.mean < d.ci_high
    with pytest.raises(ValueError, match="same rows"):
        stats.paired_difference([1, 2], [1])


def test_paired_difference_no_effect_not_significant():
    a = [1.0, 2.0, 3.0, 4.0]
    d = stats.paired_difference(a, [x + s for x, s in zip(a, [0.1, -0.1, 0.1, -0.1])])
    assert d.mean == pytest.approx(0.0, abs=1e-15) and 0.05 < d.p_less < 0.95


def test_sequential_bar_is_stricter_early_and_spends_at_most_alpha():
    bars = [stats.sequential_bar(k, 5, alpha=0.05) for k in range(1, 6)]
    assert bars == sorted(bars, reverse=True)
    assert bars[-1] > stats.normal_quantile(0.95)  # conservative against one fixed look
    spent = sum(1 - stats.normal_cdf(z) for z in bars)
    assert spent == pytest.approx(0.05, rel=1e-6)
    assert stats.sequential_bar(1, 1, alpha=0.05) == pytest.approx(stats.normal_quantile(0.95), rel=1e-9)
    assert stats.sequential_bar(2, 4, df=20) > stats.sequential_bar(2, 4)


def test_mcnemar_matches_scipy_binomtest_and_chi2():
    a = [True] * 10 + [False] * 3 + [True] * 50 + [False] * 37
    b = [False] * 10 + [True] * 3 + [True] * 50 + [False] * 37
    r = stats.mcnemar(a, b)
    assert (r.b, r.c) == (10, 3) and r.method == "exact binomial"
    assert r.p_value == pytest.approx(scipy_stats.binomtest(3, 13, 0.5).pvalue, rel=1e-9)
    a2 = [True] * 40 + [False] * 20 + [True] * 40
    b2 = [False] * 40 + [True] * 20 + [True] * 40
    r2 = stats.mcnemar(a2, b2)
    chi2 = (abs(40 - 20) - 1) ** 2 / 60
    assert r2.statistic == pytest.approx(chi2)
    assert r2.p_value == pytest.approx(scipy_stats.chi2.sf(chi2, 1), rel=1e-9)
    assert stats.mcnemar([True], [True]).p_value == 1.0


def test_mean_se_and_median():
    m, se = stats.mean_se([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and se == pytest.approx(math.sqrt(1.6666666666666667 / 4))
    assert stats.median([3, 1, 2]) == 2 and stats.median([4, 1, 2, 3]) == 2.5


def test_sequential_bar_at_the_first_of_many_looks_is_finite_and_high():
    # 3,959 steps checked every 80: 49 looks; the first spends less than 1e-16 (the H200 run's crash)
    from leadline import stats

    for df in (None, 255):
        first = stats.sequential_bar(1, 49, 0.05, df=df)
        assert math.isfinite(first) and first > 7.0
        assert first >= stats.sequential_bar(2, 49, 0.05, df=df) > stats.sequential_bar(49, 49, 0.05, df=df)

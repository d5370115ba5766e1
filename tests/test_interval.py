"""The 95% Wilson score interval that every reported accuracy carries, against published values."""

import pytest

from addernet.analysis.interval import accuracy_interval, format_accuracy, wilson_interval

# Newcombe, "Two-sided confidence intervals for the single proportion: comparison of seven methods",
# Statistics in Medicine 17 (1998) 857-872, Table I, method 3 (score interval without continuity correction),
# four decimals as printed.
NEWCOMBE_1998 = [
    ((81, 263), (0.2553, 0.3662)),
    ((15, 148), (0.0624, 0.1605)),
    ((0, 20), (0.0000, 0.1611)),
    ((1, 29), (0.0061, 0.1718)),
]

# scipy 1.17.1, scipy.stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson"), computed once:
# the official ResNet-20 on the 1,017 original test images (933 top-1, 1,010 top-5 correct), and an all-correct count.
SCIPY_1_17_1 = [
    ((933, 1017), (0.8988744654910084, 0.9327923841104855)),
    ((1010, 1017), (0.9858608460542274, 0.9966619456422371)),
    ((29, 29), (0.8830302015002592, 1.0)),
]


@pytest.mark.parametrize(("counts", "published"), NEWCOMBE_1998)
def test_wilson_interval_equals_newcombes_table(counts, published):
    low, high = wilson_interval(*counts)
    assert (round(low, 4), round(high, 4)) == published


@pytest.mark.parametrize(("counts", "published"), SCIPY_1_17_1)
def test_wilson_interval_equals_scipy(counts, published):
    assert wilson_interval(*counts) == pytest.approx(published, abs=1e-12)


def test_accuracy_interval_from_a_percentage_and_its_text():
    assert accuracy_interval(100 * 933 / 1017, 1017) == pytest.approx([89.88744654910084, 93.27923841104855])
    assert format_accuracy(100 * 933 / 1017, 1017) == "91.74 [89.89, 93.28] (933/1017)"


@pytest.mark.parametrize(("k", "n"), [(-1, 10), (11, 10), (0, 0), (1.5, 10), (True, 10)])
def test_wilson_interval_refuses_counts_that_are_not_a_binomial_outcome(k, n):
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_interval(k, n)

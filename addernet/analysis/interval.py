"""Binomial confidence intervals for accuracies: the Wilson score interval.

An accuracy measured on n images is k successes in n trials; its 95% Wilson score interval (Wilson 1927;
Newcombe 1998, "method 3") is

    (p + z^2/2n  ±  z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n),    p = k/n,  z = Phi^-1(0.975),

which stays inside [0, 1] and keeps its coverage near 95% for p close to 0 or 1, where the normal (Wald)
interval does not. It equals ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``.
"""

import math
from statistics import NormalDist


def wilson_interval(k, n, confidence=0.95):
    """(low, high) of the Wilson score interval of k successes in n trials, as proportions in [0, 1]."""
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"a binomial interval needs integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must lie in (0, 1)")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def correct_count(percent, n):
    """The number of correct images behind an accuracy of ``percent`` % on ``n`` images."""
    return round(percent * n / 100)


def accuracy_interval(percent, n, confidence=0.95):
    """[low, high] in percent, the Wilson interval of an accuracy of ``percent`` % measured on ``n`` images."""
    low, high = wilson_interval(correct_count(percent, n), n, confidence)
    return [100 * low, 100 * high]


def format_accuracy(percent, n):
    """'91.74 [89.89, 93.28] (933/1017)': an accuracy with its 95% Wilson interval and counts."""
    low, high = accuracy_interval(percent, n)
    return f"{percent:.2f} [{low:.2f}, {high:.2f}] ({correct_count(percent, n)}/{n})"

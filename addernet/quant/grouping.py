"""Grouping of an adder layer's filters by max |w|, deterministic.

kmeans (ours, default): exact 1-D k-means. In one dimension the clusters of an optimal k-means
solution are contiguous runs of the sorted values, so a dynamic programme over the sorted values
finds the global minimum of the within-cluster sum of squares (Wang & Song 2011, "Ckmeans.1d.dp");
no initialisation, no seed, no local optimum. kmeans_sklearn: the code's k-means++ Lloyd iterations
(scikit-learn, an optional extra), seeded. Either way groups are then numbered by ascending max |w|
(the code's k-means is unseeded and its labels are unordered), so runs are reproducible.
"""

import numpy as np
import torch

METHODS = ("kmeans", "kmeans_sklearn")


def kmeans_1d(values, k):
    """Labels 0..k-1 (ascending cluster means) of the optimal 1-D k-means of `values`, every cluster non-empty."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    if not 1 <= k <= n:
        raise ValueError(f"k-means needs 1 <= k <= n values, got k={k}, n={n}")
    order = np.argsort(v, kind="stable")
    x = v[order]
    s1, s2 = np.concatenate([[0.0], np.cumsum(x)]), np.concatenate([[0.0], np.cumsum(x * x)])

    cost = np.full((k + 1, n + 1), np.inf)
    start = np.zeros((k + 1, n + 1), dtype=np.int64)
    cost[0, 0] = 0.0
    for c in range(1, k + 1):
        for j in range(c, n - (k - c) + 1):
            i = np.arange(c - 1, j)  # the last cluster is x[i:j]
            sse = s2[j] - s2[i] - (s1[j] - s1[i]) ** 2 / (j - i)
            total = cost[c - 1, i] + sse
            best = int(np.argmin(total))  # first minimum: ties resolve the same way every run
            cost[c, j], start[c, j] = total[best], i[best]
    labels_sorted = np.empty(n, dtype=np.int64)
    j = n
    for c in range(k, 0, -1):
        i = start[c, j]
        labels_sorted[i:j] = c - 1
        j = i
    labels = np.empty(n, dtype=np.int64)
    labels[order] = labels_sorted
    return labels


def _kmeans_sklearn(values, k, seed):
    try:
        from sklearn.cluster import KMeans
    except ImportError:
        raise ImportError(
            "quant.grouping=kmeans_sklearn needs scikit-learn (pip install -r "
            "requirements-extras.txt), or use quant.grouping=kmeans"
        ) from None
    v = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    km = KMeans(n_clusters=k, init="k-means++", n_init=1, max_iter=300, tol=1e-4, random_state=seed).fit(v)
    labels = km.labels_
    if len(set(labels.tolist())) != k:
        raise ValueError(f"k-means left a group empty ({len(set(labels.tolist()))} of {k}); use quant.grouping=kmeans")
    rank = np.argsort(np.argsort(km.cluster_centers_.ravel(), kind="stable"), kind="stable")
    return rank[labels]


def group_filters(weight, n_groups, method="kmeans", seed=0):
    """Group index (O,) int64 of every filter of `weight` (O, ...), groups numbered by ascending max |w|."""
    feature = weight.detach().abs().flatten(1).amax(1).double().cpu().numpy()
    if method == "kmeans":
        labels = kmeans_1d(feature, n_groups)
    elif method == "kmeans_sklearn":
        labels = _kmeans_sklearn(feature, n_groups, seed)
    else:
        raise ValueError(f"unknown grouping {method!r}; choose one of {', '.join(METHODS)}")
    return torch.as_tensor(labels, dtype=torch.int64, device=weight.device)

"""Ranking candidates: the learned correction of an analytic cost model, and how well a model ranks
(Spearman's rank correlation with measured times)."""
from __future__ import annotations

RIDGE = 0.1  # shrinks the feature weights (not the intercept) towards "the analytic model is right"


def fit_log_linear(features: list[list[float]], log_ratios: list[float], ridge: float = RIDGE) -> list[float]:
    """Weights ``w`` minimising ``sum((w . f - y)^2) + ridge * |w[1:]|^2``: a correction ``exp(w . f)`` of an
    analytic estimate, fitted to ``log(measured / estimated)``.  The first feature is the intercept (1.0)."""
    import torch
    x = torch.tensor(features, dtype=torch.float64)
    y = torch.tensor(log_ratios, dtype=torch.float64)
    penalty = ridge * torch.eye(x.shape[1], dtype=torch.float64)
    penalty[0, 0] = 0.0
    return [float(v) for v in torch.linalg.solve(x.T @ x + penalty, x.T @ y)]


def _ranks(values: list[float]) -> list[float]:
    """0-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for j in range(start, end + 1):
            ranks[order[j]] = (start + end) / 2
        start = end + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation of ``xs`` and ``ys`` (1: the same order, -1: reversed; 0 when either is constant)."""
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0

"""Ranking candidates: the learned correction of an analytic cost model, and how well a model ranks
(Spearman's rank correlation with measured times)."""
from __future__ import annotations

import dataclasses
import math
from typing import Hashable, Sequence

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


@dataclasses.dataclass
class Correction:
    """``exp(w . features)``: how this machine's measurements differ from a cost model's analytic estimate (every
    tuner's model - the CPU GEMM's schedules, the pointwise kernels' loop nests - uses this one class).

    Fitted by ridge least squares of ``log(measured / estimated)`` on the features, centred within each problem
    first: a correction only ever ranks the candidates of one problem, and without the centring, features that
    grow with the problem's size (the GEMM's log kc with k, log mc with m) learned how the estimate's scale
    differs between problems instead of what orders one problem's candidates (leave-one-problem-out on the
    suite's GEMMs: corrected mean Spearman 0.60 against the analytic part's 0.70 before centring).  So the
    corrected estimate ranks well and its absolute scale is the analytic one's."""
    weights: list[float] = dataclasses.field(default_factory=list)  # none: no correction (factor 1)
    samples: int = 0

    def factor(self, features: Sequence[float]) -> float:
        return math.exp(sum(w * f for w, f in zip(self.weights, features)))

    @staticmethod
    def fit(rows: Sequence[tuple[Hashable, Sequence[float], float]], ridge: float = RIDGE) -> "Correction":
        """From ``(problem, features, log(measured / estimated))`` rows (features[0] the intercept, 1.0); no rows,
        no correction."""
        if not rows:
            return Correction()
        groups: dict[Hashable, list[int]] = {}
        for i, (problem, _, _) in enumerate(rows):
            groups.setdefault(problem, []).append(i)
        x = [list(f) for _, f, _ in rows]
        y = [r for _, _, r in rows]
        width = len(x[0])
        for members in groups.values():
            y_mean = sum(y[i] for i in members) / len(members)
            x_mean = [sum(x[i][f] for i in members) / len(members) for f in range(width)]
            x_mean[0] = 0.0  # (the intercept stays: it fits the centred targets' mean, zero)
            for i in members:
                y[i] -= y_mean
                x[i] = [v - mu for v, mu in zip(x[i], x_mean)]
        return Correction(fit_log_linear(x, y, ridge), len(rows))


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

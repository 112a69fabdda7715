"""Tuning: schedules measured per kernel and kept in a persistent database (``kiln.tune.db``)."""


def live_kinds() -> tuple[str, ...]:
    """The record kinds kiln reads today (what ``kiln db prune --retired`` keeps): the tuners' and every choice
    kind's current version."""
    from kiln.passes import pipeline  # noqa: F401  (its passes declare the choice kinds)
    from kiln.schedule import choose, matmul_fusion  # noqa: F401  (choose: the layout kind)
    from kiln.tune import cpu, cpu_gemm
    from kiln.tune.choices import KINDS
    return cpu.KINDS + cpu_gemm.KINDS + (matmul_fusion.KIND,) + tuple(k.record_kind for k in KINDS.values())

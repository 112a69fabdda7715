"""Tuning: schedules measured per kernel and kept in a persistent database (``kiln.tune.db``)."""


def live_kinds() -> tuple[str, ...]:
    """The record kinds kiln reads today (what ``kiln db prune --retired`` keeps)."""
    from kiln.schedule import matmul_fusion
    from kiln.tune import cpu, cpu_gemm
    return cpu.KINDS + cpu_gemm.KINDS + (matmul_fusion.KIND,)

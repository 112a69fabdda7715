"""Tuning: schedules measured per kernel and kept in a persistent database (``kiln.tune.db``)."""


def live_kinds() -> tuple[str, ...]:
    """The record kinds kiln reads today (what ``kiln db prune --retired`` keeps): the pointwise tuner's, the
    layout, bmm operand layout and half-precision choices', and every operator's (``kiln.library``: its choice kinds and tuners)."""
    from kiln import library
    from kiln.passes.half_in_fp32 import HALF_IN_FP32
    from kiln.schedule.choose import LAYOUT
    from kiln.schedule.operand_layout import BMM_LAYOUT
    from kiln.tune import cpu
    return cpu.KINDS + (LAYOUT.record_kind, BMM_LAYOUT.record_kind, HALF_IN_FP32.record_kind) + library.records()

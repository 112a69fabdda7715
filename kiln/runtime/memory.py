"""Memory planning: intermediates share one arena, placed by liveness.

Each intermediate buffer lives from the step that writes it to the last step that reads it.  Buffers are
placed largest first at the lowest offset that does not overlap any buffer whose lifetime intersects
(greedy best fit), aligned to 64 bytes.  The arena is allocated once per compiled graph and kept across
calls, so a call touches no fresh pages (with glibc's malloc, large per-call allocations fault every page on
every call).
"""
from __future__ import annotations

import dataclasses

ALIGN = 64


@dataclasses.dataclass
class Interval:
    name: str
    nbytes: int
    start: int  # first step that writes it
    end: int    # last step that reads it


@dataclasses.dataclass
class MemoryPlan:
    offsets: dict[str, int]
    arena_bytes: int
    naive_bytes: int   # what one allocation per buffer would take

    def describe(self) -> str:
        saved = 1 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0
        return (f"arena {self.arena_bytes / 2**20:.2f} MiB for {len(self.offsets)} intermediates "
                f"({self.naive_bytes / 2**20:.2f} MiB without reuse, {saved:.0%} saved)")


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(intervals: list[Interval]) -> MemoryPlan:
    placed: list[tuple[int, int, Interval]] = []  # (offset, size, interval)
    offsets: dict[str, int] = {}
    for iv in sorted(intervals, key=lambda i: (-i.nbytes, i.start)):
        size = _aligned(max(iv.nbytes, 1))
        busy = sorted((off, sz) for off, sz, other in placed if not (other.end < iv.start or iv.end < other.start))
        offset = 0
        for off, sz in busy:
            if offset + size <= off:
                break
            offset = max(offset, off + sz)
        placed.append((offset, size, iv))
        offsets[iv.name] = offset
    arena = max((off + sz for off, sz, _ in placed), default=0)
    naive = sum(_aligned(max(i.nbytes, 1)) for i in intervals)
    return MemoryPlan(offsets, arena, naive)

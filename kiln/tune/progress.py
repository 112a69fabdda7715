"""The max-autotune progress line on stderr: what is being tuned, how far, the best time, the budget left.

Tuning a model takes minutes; a compile that says nothing for that long looks hung.  ``begin`` prints at once,
before capture and the passes (seconds of their own); the CPU tuner updates the line per kernel; ``end`` closes
it.  On a terminal the line is rewritten in place; in a log file only the first and the last state are written.
``Config.tune_progress`` turns it off.
"""
from __future__ import annotations

import sys
import time

from kiln import config


class ProgressLine:
    def __init__(self, what: str, budget_s: float):
        self.what, self.budget_s = what, budget_s
        self.start = time.monotonic()
        self.live = sys.stderr.isatty()
        self.last = ""
        self.kernels = ""  # "3/5 kernels", once the tuner has reported
        self._write(f"kiln max-autotune: {what}: capturing and optimizing the graph (budget {budget_s:.0f} s)",
                    force=True)

    def _write(self, text: str, force: bool = False) -> None:
        self.last = text
        if self.live:
            print("\r" + text + " " * 8, end="", file=sys.stderr, flush=True)
        elif force:
            print(text, file=sys.stderr, flush=True)

    def update(self, done: int, total: int, best_s: float | None, left_s: float) -> None:
        self.kernels = f"{done}/{total} kernels tuned"
        bar = "#" * int(20 * done / max(total, 1))
        best = f"{best_s * 1e3:.3f} ms" if best_s is not None else "-"
        self._write(f"kiln max-autotune: {self.what}: [{bar:<20}] kernels {done}/{total}  last best {best}  "
                    f"budget left {left_s:4.0f} s  ({time.monotonic() - self.start:.0f} s)")

    def end(self) -> None:
        text = f"kiln max-autotune: {self.what}: done in {time.monotonic() - self.start:.1f} s" + \
            (f", {self.kernels}" if self.kernels else "")
        if self.live:
            print("\r" + text + " " * 40, file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)


_current: ProgressLine | None = None


def begin(what: str) -> None:
    """Start the line for one graph's max-autotune compile (if ``Config.tune_progress``)."""
    global _current
    if config.get().tune_progress:
        _current = ProgressLine(what, config.get().tune_budget_s)


def update(done: int, total: int, best_s: float | None, left_s: float) -> None:
    if _current is not None:
        _current.update(done, total, best_s, left_s)


def end() -> None:
    global _current
    if _current is not None:
        _current.end()
        _current = None

"""Full garbage collections kept out of a compile.

[Note: frozen heap during compile]
A process that has imported torch, transformers and Triton holds millions of tracked objects, and CPython's
generation-2 collection scans all of them: one such pause took 0.42 s of encoder_fast's 1.35 s first call on
the H100 (kiln's compile allocates enough to trigger it; Inductor's decoder_fast paid 0.25 s for one in the same
run).  What existed before a compile (the model, torch's and Dynamo's state) almost all outlives it, so kiln
moves it out of the collector's sight for the compile's duration (``gc.freeze``) and back afterwards
(``gc.unfreeze``): the collections the compile triggers scan only the compile's own objects.  An old object that
becomes cyclic garbage during the compile waits for the next full collection after it - no longer than the
compile.  The full collection the compile's allocations would have triggered is not cancelled, only moved
out of the compile to wherever the program next allocates enough (a call that allocates little - a compiled
call - triggers none).

A process that froze objects itself (``gc.freeze`` before forking workers, as servers do) keeps its own
arrangement: kiln neither freezes nor unfreezes when the frozen count is not zero on entry.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0   # nested compiles (a graph break's second graph compiles inside the first call)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Run the block with the objects that exist on entry frozen (see the note above)."""
    global _depth
    with _lock:
        mine = _depth > 0 or gc.get_freeze_count() == 0
        if mine:
            if _depth == 0:
                gc.freeze()
            _depth += 1
    try:
        yield
    finally:
        if mine:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    gc.unfreeze()

"""Kernel expressions are DAGs: a value read twice is one object reached along two paths.  Hashing, equality and
``subexprs`` each visit a node once, so an expression whose every step reads the previous one twice (a running
maximum over a window) costs its number of nodes, not two to the power of its depth."""
import pickle
import time

import torch

from kiln.ir.kernel import KConst, KOp, subexprs
from kiln.ir.ops import Op


def _doubling(depth, op_at=None):
    e = KConst(1.0, torch.float32)
    for i in range(depth):
        e = KOp(Op.MUL if i == op_at else Op.ADD, (e, e), torch.float32)
    return e


def test_deep_shared_expression_is_linear():
    start = time.perf_counter()
    e = _doubling(64)
    assert len(list(subexprs(e))) == 65
    copy = pickle.loads(pickle.dumps(e))  # (a separately built copy: equal node by node, no object shared)
    assert copy == e and hash(copy) == hash(e) and {e: 1}[copy] == 1
    assert _doubling(64, op_at=40) != e
    assert time.perf_counter() - start < 5.0

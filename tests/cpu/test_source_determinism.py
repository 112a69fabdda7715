"""The generated source depends only on the graph, not on what the process compiled before (cache keys)."""
import torch

import kiln
from kiln.report import mark, reports_since


def _source(fn, *inputs):
    torch._dynamo.reset()
    position = mark()
    with torch.inference_mode():
        kiln.compile(fn)(*inputs)
    return reports_since(position)[-1].source


def test_same_graph_same_source_after_other_compiles():
    def f(x):
        return torch.softmax(x * 2, -1) + 1
    x = torch.randn(8, 16)
    first = _source(f, x)
    _source(lambda y: (y.exp() - y).sum(0), torch.randn(5, 7))  # creates other nodes in between
    assert _source(f, x) == first

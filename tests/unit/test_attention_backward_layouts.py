"""[Note: cuDNN attention's backward reads its operands in the forward's layouts] (ir/extern.py): the cuDNN
attention backward infers its output's and incoming gradient's layout from the query's, so kiln's call hands it
``out`` and ``grad_out`` laid out as the query is (and the statistics contiguous), copying only what does not
match.  The op itself needs a GPU; here it is replaced by a recorder of what it was given."""
import pytest
import torch

from kiln.ir import extern


@pytest.fixture
def received(monkeypatch):
    seen = {}

    def record(grad_out, query, key, value, out, logsumexp, *args, **kwargs):
        seen.update(grad_out=grad_out, query=query, out=out, logsumexp=logsumexp, args=args, kwargs=kwargs)
        return query, key, value
    monkeypatch.setattr(extern, "_CUDNN_BACKWARD", record)
    return seen


def _heads(b=2, t=5, h=3, d=4):
    """A [B, H, T, D] view of a [B, T, H, D] projection, as attention's query is."""
    return torch.randn(b, t, h, d).transpose(1, 2)


def test_contiguous_out_and_gradient_are_laid_out_as_the_query(received):
    q, k, v = _heads(), _heads(), _heads()
    out, grad = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)  # (contiguous: kiln's own layout)
    lse = torch.randn(2, 3, 5, 1).transpose(2, 3).transpose(2, 3)[..., 0]
    call = extern.fast_callable(torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default)
    call(grad, q, k, v, out, lse, None, None, None, None, None, 5, 5, 0.0, False, scale=0.5)
    got = received
    assert got["out"].stride() == q.stride() and got["grad_out"].stride() == q.stride()
    torch.testing.assert_close(got["out"], out, rtol=0, atol=0)
    torch.testing.assert_close(got["grad_out"], grad, rtol=0, atol=0)
    assert got["logsumexp"].is_contiguous() and got["query"] is q
    assert got["args"][-2:] == (0.0, False) and got["kwargs"] == {"scale": 0.5}


def test_matching_operands_pass_without_a_copy(received):
    q = _heads()
    out, grad = _heads(), _heads()
    lse = torch.randn(2, 3, 5)
    extern.cudnn_attention_backward(grad, q, q, q, out, lse, None, None, None, None, None, 5, 5, 0.0, False)
    assert received["out"] is out and received["grad_out"] is grad and received["logsumexp"] is lse


def test_matching_layout_orders_dimensions_like_the_reference():
    like = torch.randn(2, 7, 3, 4).permute(0, 2, 1, 3)  # [2, 3, 7, 4], memory order (0, 2, 1, 3)
    t = torch.randn(2, 3, 7, 4)
    moved = extern.matching_layout(t, like)
    assert moved.stride() == like.stride()
    torch.testing.assert_close(moved, t, rtol=0, atol=0)
    assert extern.matching_layout(moved, like) is moved
    # a size-1 dimension's stride does not matter
    one = torch.randn(2, 1, 7, 4)
    assert extern.matching_layout(one, torch.randn(2, 7, 1, 4).transpose(1, 2)) is one


def _cudnn_attention_graph():
    """A self-attention's core and its backward as kiln lowers them for the GPU: q, k, v views of one projection,
    ATen's cuDNN attention and its backward (traced on fake tensors - their meta functions need no GPU), the
    heads merged for the next products."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.frontend.lower import lower_fx

    def f(x, w, w2, g):
        q, k, v = (t.transpose(1, 2) for t in (x @ w).view(2, 16, 3, 4, 8).unbind(2))
        out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True)
        grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            g, q, k, v, out, lse, seed, offset, None, cq, ck, mq, mk, 0.0, False)
        return [out.transpose(1, 2).reshape(32, 32) @ w2] + [d.transpose(1, 2).reshape(32, 32) @ w2 for d in grads]
    gm = make_fx(f, tracing_mode="fake")(torch.randn(2, 16, 32), torch.randn(32, 96), torch.randn(32, 32),
                                         torch.randn(2, 4, 16, 8))
    graph, _ = lower_fx(gm, {}, triton=True)
    attention = [n for n in graph.nodes if n.op.value == "extern" and "cudnn_attention" in str(n.attr("target"))
                 and n.shape == (2, 4, 16, 8)]
    return graph, attention


@pytest.mark.parametrize("on", [False, True])
def test_attention_gradients_planned_in_their_operands_layout(on):
    """[Note: attention results in ATen's layout]: the forward's output keeps the query's layout (always), the
    backward's gradients their operands' (with ``attention_result_layouts``), so each heads' merge for the next
    product is a view - no copy kernel."""
    from kiln import config
    from kiln.schedule.layout import VIEW_COPY, relayout_copies
    from kiln.schedule.plan import make_plan

    graph, (out, *grads) = _cudnn_attention_graph()
    merged = (512, 8, 32, 1)  # ([B, H, T, D] laid out [B, T, H, D], as the meta functions say)
    with config.scope(attention_result_layouts=on):
        plan = make_plan(graph)
        copied = relayout_copies(graph, plan, weights=False)
    copies = [n for n in copied.nodes if n.attr(VIEW_COPY)]
    assert len(grads) == 3 and plan.strides_of[out] == merged
    if on:
        assert all(plan.strides_of[d] == merged for d in grads) and not copies
    else:
        assert not any(d in plan.strides_of for d in grads) and len(copies) == 3

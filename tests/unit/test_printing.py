"""The printing core both code generators share (kiln/codegen/printing.py): one operator-table lookup, the
rules both targets write alike written once, one temporaries naming, one index renderer, one set of reduction
start values."""
import pytest
import torch

from kiln.codegen import cpp_expr, triton_expr
from kiln.codegen.printing import SHARED, Temporaries
from kiln.ir.index import FloorDiv, Lin, Mod, Var, render
from kiln.ir.ops import Op, reduction_identity


def test_the_shared_rules_are_one_rule_in_both_tables():
    for op in SHARED:
        assert cpp_expr.CPP_OPS.rules[op] is triton_expr.TRITON_OPS.rules[op] is SHARED[op]
        assert cpp_expr.op_text(op, ["a", "b"], torch.float32, torch.float32) == \
            triton_expr.op_text(op, ["a", "b"], torch.float32, torch.float32)


def test_each_target_keeps_what_differs_and_names_itself_when_it_cannot():
    f32 = torch.float32
    assert cpp_expr.op_text(Op.EXP, ["x"], f32, f32) == "k_exp(x)"           # the prelude's vectorizable exp
    assert triton_expr.op_text(Op.EXP, ["x"], f32, f32) == "tl.exp(x)"
    assert cpp_expr.op_text(Op.CAST, ["x"], torch.bool, f32) == triton_expr.op_text(Op.CAST, ["x"], torch.bool, f32)
    with pytest.raises(NotImplementedError, match="Triton codegen: no rule for exp"):
        triton_expr.op_text(Op.EXP, ["x"], torch.int32, torch.int32)
    with pytest.raises(NotImplementedError, match="C\\+\\+ codegen: no rule for"):
        cpp_expr.op_text(Op.SUM, ["x"], f32, f32)


def test_one_index_renderer_with_each_targets_division():
    i, j = Var("i", 64), Var("j", 9)
    index = Lin.of(FloorDiv(Lin.of(i), 4)) * 8 + Lin.of(Mod(Lin.of(j), 3)) + 2
    c, py = render(index, str), triton_expr.render_index(index, str)
    assert "((i) / 4)" in c and "((j) % 3)" in c and c.endswith("+ 2")
    assert py == c.replace(" / ", " // ").replace("8*", "8 * ")


def test_reduction_start_values_are_one_table_printed_per_target():
    assert reduction_identity(Op.AMAX, torch.float32) == float("-inf")
    assert reduction_identity(Op.AMIN, torch.int8) == 127 and reduction_identity(Op.AMAX, torch.bool) is False
    assert cpp_expr.literal(reduction_identity(Op.AMAX, torch.float32), torch.float32) == "-float(__builtin_inf())"
    assert triton_expr.literal(reduction_identity(Op.AMAX, torch.float32), torch.float32) == 'float("-inf")'


def test_temporaries_share_one_counter_across_nested_bodies():
    outer = Temporaries()
    inner = Temporaries(outer.names, outer.counter)
    assert [outer.fresh(), inner.fresh(), outer.fresh()] == ["t0", "t1", "t2"]

"""[Note: foreach ops] (kiln/frontend/foreach.py): every functional ``aten._foreach_*`` overload kiln decomposes
gives eager's values, dtypes and shapes entry by entry, on random inputs of two shapes."""
import pytest
import torch

from kiln.frontend.foreach import foreach_decompositions

TABLE = foreach_decompositions()


def _arguments(schema, generator):
    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    lists = [[randn(3, 4), randn(5)], [randn(3, 4), randn(5)],
             [torch.rand(3, 4, generator=generator) + 0.5, torch.rand(5, generator=generator) + 0.5]]
    args, used = [], 0
    for a in schema.arguments:
        if a.kwarg_only:
            continue
        kind = str(a.type)
        if kind == "List[Tensor]":
            args.append([t.clone() for t in lists[used]])
            used += 1
        elif kind in ("List[Scalar]", "List[number]"):
            args.append([0.5, 1.5])
        elif kind in ("Scalar", "number"):
            args.append(0.7)
        elif kind == "Tensor":  # addcmul/addcdiv's value per entry, or the one tensor of ``.Tensor`` overloads
            args.append(torch.tensor([0.3, 0.6]) if a.name == "scalars" else torch.tensor(0.4))
        else:
            args.append(a.default_value)
    if schema.name.endswith("lerp") and schema.overload_name == "List":  # (weights in [0, 1])
        args[2] = [torch.rand(3, 4, generator=generator), torch.rand(5, generator=generator)]
    return args


def test_every_functional_foreach_op_is_decomposed():
    names = {op._schema.name for op in TABLE}
    for op in ("add", "mul", "addcdiv", "addcmul", "lerp", "sqrt", "maximum", "pow", "norm", "div", "sub"):
        assert f"aten::_foreach_{op}" in names, op
    assert not any(op._schema.name.endswith("_") for op in TABLE)  # (in-place ones arrive functionalized)


@pytest.mark.parametrize("op", sorted(TABLE, key=str), ids=str)
def test_the_decomposition_gives_eagers_values(op):
    generator = torch.Generator().manual_seed(0)
    args = _arguments(op._schema, generator)
    want = op(*args)
    got = TABLE[op](*args)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, equal_nan=True)

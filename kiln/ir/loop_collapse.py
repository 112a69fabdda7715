"""Loop collapsing for pointwise kernels: adjacent loops that every access walks as one run become one loop.

A pointwise kernel that cannot run as one flat loop (some access needs a division by a dimension, e.g. a
per-channel broadcast or a channels-last operand) keeps one loop per dimension.  Short inner dimensions then
cost vector efficiency (a 220-wide loop leaves a 12-element tail; a 7-wide one barely vectorizes).  Two
adjacent loops ``v_j`` (extent ``S_j``) and ``v_{j+1}`` (extent ``S_{j+1}``) can be replaced by one loop
``u = v_j * S_{j+1} + v_{j+1}`` of extent ``S_j * S_{j+1}`` whenever every index in the kernel uses them as
``c * S_{j+1} * v_j + c * v_{j+1}`` (then the pair contributes ``c * u``); loops of extent 1 disappear.

Example: bias add + ReLU reading a channels-last convolution output, writing NCHW ([1, 128, 220, 220])::

    before: outer=[1, 128, 220, 220]
      loop out[6195200*i0 + 48400*i1 + 220*i2 + i3] =
           relu(conv[6195200*i0 + i1 + 28160*i2 + 128*i3] + bias[i1])
    after:  outer=[128, 48400]
      loop out[48400*i0 + i1] = relu(conv[i0 + 128*i1] + bias[i0])

The result is the same kernel on fewer, longer loops; the C++ writer then sees one long inner loop (and, for
a transposed operand like ``conv`` above, a 2-D loop it can tile, see ``codegen/cpp_tile.py``).
"""
from __future__ import annotations

import dataclasses

from kiln.ir.index import FloorDiv, Lin, Mod, Var
from kiln.ir.kernel import Kernel, index_atoms, map_indices


def _nested_vars(index: Lin) -> set[Var]:
    """Loop variables used inside a floor division or modulo of ``index`` (a gather's own indices are visited
    separately by ``Kernel.indices``)."""
    out: set[Var] = set()
    for atom in index.atoms():
        if isinstance(atom, (FloorDiv, Mod)):
            out |= {a for a in index_atoms(atom.arg) if isinstance(a, Var)}
    return out


def _mergeable(kernel: Kernel, a: Var, b: Var) -> bool:
    """Does every index use ``a`` (outer) and ``b`` (inner) as ``c * b.size * a + c * b``?"""
    for index in kernel.indices():
        if {a, b} & _nested_vars(index):
            return False
        if index.coefficient(a) != index.coefficient(b) * b.size:
            return False
    return True


def collapse_loops(kernel: Kernel) -> Kernel:
    """Merge adjacent mergeable loops of a pointwise kernel and drop loops of extent 1 (see module doc)."""
    if kernel.is_reduction or len(kernel.outer) < 2:
        return kernel
    return _collapse(kernel, "i")


def collapse_rows(kernel: Kernel) -> Kernel:
    """The same for a reduction kernel's row loops ``o0, o1, ..`` (the reduced axis ``r`` is left alone): the
    column-reduction writer (``codegen/cpp_columns.py``) wants one long run of rows side by side, and an NCHW
    tensor's channel statistics have rows ``[N, H, W]`` whose ``H`` and ``W`` are one run of ``H * W``."""
    if not kernel.is_reduction or len(kernel.outer) < 2:
        return kernel
    return _collapse(kernel, "o")


def _collapse(kernel: Kernel, prefix: str) -> Kernel:
    old = [Var(f"{prefix}{d}", s) for d, s in enumerate(kernel.outer)]
    groups: list[list[Var]] = []
    for v in old:
        if v.size == 1:
            continue
        if groups and _mergeable(kernel, groups[-1][-1], v):
            groups[-1].append(v)
        else:
            groups.append([v])
    if not groups:  # a single element: keep one loop of extent 1
        groups = [[old[-1]]]
    if len(groups) == len(old):
        return kernel
    new = []
    mapping: dict[Var, Lin] = {v: Lin(0) for v in old}
    for j, g in enumerate(groups):
        size = 1
        for v in g:
            size *= v.size
        u = Var(f"{prefix}{j}", size)
        new.append(u)
        mapping[g[-1]] = Lin.of(u)  # the outer members' terms are multiples of the innermost's (checked)
    out = map_indices(kernel, lambda index: index.substitute(mapping))
    return dataclasses.replace(out, outer=tuple(u.size for u in new))

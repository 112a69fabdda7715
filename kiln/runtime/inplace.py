"""In-place reuse: a kernel may write its result over an input that dies with it.

When a buffer is read for the last time by the kernel that writes another buffer of the same size, the
result can take the input's memory instead of a new block: peak memory then holds one of the two, not both
(a convolution's output and the BatchNorm + ReLU after it: 24.5 MiB instead of 49 on ResNet-18 batch 16).

Whether the *kernel* allows it is decided here; whether the input dies there, and the sizes, by the runtime
(``schedule/program.py``, ``_allocations``).  The kernel must read the input only at the element it writes::

    kernel_3_mul_add_relu  outer=[16, 64, 112, 112]
      loop   buf9[i] = relu(buf7[i] * buf2[c] + buf3[c])      buf9 may take buf7's memory
      loop   buf9[i] = buf7[i] + buf7[i + 1]                  no: buf7[i + 1] is read after buf9[i] is written
                                                               (by another program, in another order)

Conditions, each for a reason:

- every load of the input, in every phase, is at the store's index (the same ``Lin`` over the same loop
  variables): element ``e`` is then read only by the program instance that writes ``e``, and reductions
  reading the row earlier (a layer norm's statistics) finish before the row's epilogue stores;
- the store is the kernel's last, and its value contains that load (looking through row-scratch values,
  which the Triton kernels keep in registers or recompute): in program order every load of the input
  comes before the store, and the stored element depends on the loaded one (so also across a layout
  conversion inside the program, which synchronizes);
- same element size (the index counts elements from the buffer's base).
"""
from __future__ import annotations

from kiln.ir.kernel import KLoad, Kernel, ReduceLoop, index_exprs, phase_exprs, phase_stores, subexprs


def overwritable_inputs(kernel: Kernel, out: str) -> list[str]:
    """Buffers this kernel reads that its store to ``out`` may overwrite element by element."""
    stores = [st for p in kernel.phases for st in phase_stores(p) if st.buf not in kernel.scratch]
    if not stores or stores[-1].buf != out or sum(st.buf == out for st in stores) != 1:
        return []
    store = stores[-1]
    # a row-scratch value is kept in registers or recomputed by the Triton kernels: look through it
    scratch = {st.buf: st.value for p in kernel.phases if isinstance(p, ReduceLoop) for st in p.stores}
    in_value: dict[str, KLoad] = {}
    stack = [store.value]
    while stack:
        for x in subexprs(stack.pop()):
            if isinstance(x, KLoad) and x.buf in scratch:
                stack.append(scratch.pop(x.buf))
            elif isinstance(x, KLoad) and x.index == store.index:
                in_value[x.buf] = x
    loads: dict[str, set[KLoad]] = {}
    for p in kernel.phases:
        for e in phase_exprs(p):
            for x in subexprs(e):
                if isinstance(x, KLoad):
                    loads.setdefault(x.buf, set()).add(x)
        for st in phase_stores(p):  # loads inside store indices (scatter-like writes) disqualify their buffer
            for x in (y for i in index_exprs(st.index) for y in subexprs(i)):
                if isinstance(x, KLoad):
                    loads.setdefault(x.buf, set()).add(KLoad(x.buf, None, x.dtype))
    return [buf for buf, found in loads.items()
            if buf != out and buf in in_value and buf not in kernel.scratch and found == {in_value[buf]}]


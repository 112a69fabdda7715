"""The error a compiled graph raises for an input it was not compiled for.

A graph is compiled for one dtype, shape and device per input; TorchDynamo's guards normally pick (or recompile)
the graph that fits, so this is the last line of defence, for calls that reach a graph without them.  The graph
knows its inputs only by position; ``named`` lets the compiler, which knows the user's argument names (from
TorchDynamo's sources, frontend/dynamo.py), put the name in the message.
"""
from __future__ import annotations

from typing import Any

import torch


class InputMismatch(ValueError):
    """Input ``k`` of a compiled graph is not ``dtype`` of ``shape`` on ``device`` (a device type, "cpu")."""

    def __init__(self, k: int, dtype: torch.dtype, shape: Any, device: str, got: torch.Tensor,
                 name: str | None = None):
        self.k, self.dtype, self.shape, self.device, self.got, self.name = k, dtype, list(shape), device, got, name
        label = f"input {k}" if not name else f"argument {name!r}" if name.isidentifier() else f"argument {name}"
        super().__init__(f"kiln: {label} expected {dtype} of shape {self.shape} on {device}, got {got.dtype} of "
                         f"shape {list(got.shape)} on {got.device.type}; this graph was compiled for the expected "
                         f"tensor: call the model through torch.compile or kiln.compile, whose guards compile "
                         f"another graph for another dtype, shape or device")

    def named(self, name: str | None) -> "InputMismatch":
        """The same error, naming the user's argument ``name`` (None: the position stays)."""
        return InputMismatch(self.k, self.dtype, self.shape, self.device, self.got, name)

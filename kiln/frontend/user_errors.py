"""The model's own errors, not TorchDynamo's tracing report: kiln.compile's guard around a compiled call.

[Note: errors found while tracing] A call with inputs the model cannot take (a matmul whose sizes disagree, float
indices for an embedding, int64 images for a float convolution) fails inside TorchDynamo: it runs every op on fake
tensors while it traces, and raises ``TorchRuntimeError``, a page about fake tensors and graph breaks around a
meta kernel's message, instead of the error the model raises uncompiled.  Tracing runs none of the model's code,
so kiln.compile runs such a call again, eagerly: the model raises its own error (or, where the fake tensors were
stricter than eager, returns eager's result, with one warning).  A frame TorchDynamo reaches after part of the
call has run (code after a graph break) cannot be re-run without repeating that part's side effects; there kiln
raises its own error, with the inputs, the op's message and the user's source line.  Which case it is shows in the
traceback: frames of the user's code are still running between kiln's call and TorchDynamo's frame conversion in
the second case only.

``torch.compile(model, backend="kiln")`` has no such guard (the backend only sees graphs, after tracing): its
callers get TorchDynamo's report, as with any backend.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import warnings
from typing import Any, Callable

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME_CONVERSION = os.path.join(_TORCH_DIR, "_dynamo", "convert_frame.py")


def guard(compiled: Callable, eager: Callable) -> Callable:
    """``compiled`` (torch.compile's wrapper of ``eager``) with TorchDynamo's tracing errors replaced by the
    model's own, from an eager run, or by kiln's error where re-running is not safe (see the Note above)."""
    from torch._dynamo.exc import BackendCompilerFailed, TorchRuntimeError
    warned = False

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        try:
            return compiled(*args, **kwargs)
        except (TorchRuntimeError, BackendCompilerFailed) as exc:
            failure = exc
        # (from here on outside the ``except``: the error raised below does not chain TorchDynamo's report)
        if isinstance(failure, BackendCompilerFailed):  # kiln's own error (a target it cannot honour here, a failed
            raise getattr(failure, "inner_exception", failure) from None  # compile with fallback=False), unwrapped
        if not _nothing_ran(failure):
            raise RuntimeError(_partial_run_message(failure, eager, args, kwargs)) from None
        result = _run_eagerly(eager, args, kwargs)
        if not warned:
            warned = True
            warnings.warn(f"kiln: TorchDynamo could not trace this call ({_op_error(failure)}), so it ran eagerly",
                          stacklevel=2)
        return result
    return call


class _QuietMetaFailures(logging.Filter):
    """Drops the fake-tensor mode's log of a failed meta kernel (an error-level record with a traceback, printed
    before TorchDynamo raises) while a kiln.compile call is on the stack: kiln then re-runs the call eagerly or
    raises its own error, which carries the same message.  The stack is walked only when such a record comes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("failed while attempting to run meta"):
            return True
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code is _GUARDED_CALL:
                return False
            frame = frame.f_back
        return True


_GUARDED_CALL = guard(lambda: None, lambda: None).__code__
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietMetaFailures())


def _run_eagerly(eager: Callable, args: tuple, kwargs: dict) -> Any:
    """The call, uncompiled; its error says where it came from (a note, so type and message stay eager's)."""
    try:
        return eager(*args, **kwargs)
    except Exception as exc:
        exc.add_note("(kiln: TorchDynamo could not trace this call, so kiln ran the model eagerly: this is the "
                     "model's own error)")
        raise


def _nothing_ran(exc: BaseException) -> bool:
    """Whether ``exc`` came from tracing the call's first frame, before any of the user's code ran: every frame
    between kiln's call and TorchDynamo's frame conversion is PyTorch's own."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # (the first is ``call`` itself)
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if path == _FRAME_CONVERSION:
            return True
        if not path.startswith(_TORCH_DIR):
            return False
        tb = tb.tb_next
    return False


def _op_error(exc: BaseException) -> str:
    """The error of the op that failed on fake tensors (TorchDynamo keeps it as the cause of the graph break it
    turned into ``exc``), else the first line of TorchDynamo's message."""
    original = getattr(exc.__context__, "__cause__", None)
    if original is not None:
        return f"{type(original).__name__}: {str(original).rstrip('.')}"
    return str(exc).strip().splitlines()[0]


def _user_line(exc: BaseException) -> str:
    """Where in the user's code the op was: the innermost frame TorchDynamo was tracing."""
    stack = getattr(exc, "real_stack", None)
    if not stack:
        return "an unknown line"
    frame = stack[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}" + (f": {frame.line.strip()}" if frame.line else "")


def _describe_inputs(fn: Callable, args: tuple, kwargs: dict) -> str:
    """The call's tensor arguments by parameter name (position where the signature does not say):
    ``x: torch.float32[3, 7] on cpu``."""
    try:
        named = inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn).bind_partial(
            *args, **kwargs).arguments
    except (TypeError, ValueError):
        named = {**{str(k): v for k, v in enumerate(args)}, **kwargs}
    parts = [f"{name}: {v.dtype}{list(v.shape)} on {v.device}" for name, v in named.items()
             if isinstance(v, torch.Tensor)]
    return ", ".join(parts) or "no tensor arguments"


def _partial_run_message(exc: BaseException, eager: Callable, args: tuple, kwargs: dict) -> str:
    """kiln's error for a failure found after part of the call ran: the inputs, the op's error, the line."""
    return (f"kiln: the model fails on this call's inputs ({_describe_inputs(eager, args, kwargs)}): "
            f"{_op_error(exc)} (at {_user_line(exc)}).  TorchDynamo found it while tracing code after a graph "
            f"break, when part of the call had already run, so kiln did not re-run the call eagerly; run the "
            f"model uncompiled for PyTorch's own error")

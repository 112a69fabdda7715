"""CUDA graphs for ``reduce-overhead``: a compiled graph recorded once and replayed (``GraphReplay``), the
recordings' outputs handed out without copies, and the same logic emulated over CPU modules for tests
([Note: CUDA graphs emulated on the CPU]).  Split from runtime/triton_module.py (session 44)."""
from __future__ import annotations

import contextlib
import operator
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from kiln import config
from kiln.report import CompileReport
from kiln.runtime import profiling
from kiln.runtime.errors import InputMismatch

if TYPE_CHECKING:
    from kiln.runtime.triton_module import TritonGraph

class GraphPool:
    """[Note: one memory pool for a symbolic graph's sizes] Under reduce-overhead each size of a symbolic graph
    records CUDA graphs of its own (up to ``SIZES_KEPT``).  In private pools each recording would hold its
    intermediates' memory for good - a pool per size; the sizes' recordings share this one pool instead, so a
    capture may place its intermediates where an earlier capture's intermediates were (free once that capture
    ended).  Replays run one after another on one stream, so recordings that overlap in intermediates do not
    disturb each other.  What must not be overwritten is an output the caller still holds: a recording's output
    buffers stay allocated, but they may lie where a recording captured *before* them keeps intermediates (that
    memory was free then), and that recording's replay writes there.  So before any replay in the pool, every
    recording's outputs the caller still holds are moved onto copies (``release``), not only the replaying
    recording's ([Note: outputs of a replay]): a decoding loop that drops each step's logits pays nothing."""

    def __init__(self) -> None:
        self.handle: Any = None  # torch.cuda.graph_pool_handle(), made at the first recording
        self.handed: dict[int, "_Recording"] = {}  # recordings whose outputs the caller may hold, by id

    def release(self) -> bool:
        """Make every output handed out by the pool's recordings free to overwrite; False if the caller holds a
        view that cannot be moved (the call then runs without a graph)."""
        for key, recording in list(self.handed.items()):
            if not recording.release_outputs():
                return False
            if not recording.holds_aliases():
                del self.handed[key]
        return True

    def note_handed(self, recording: "_Recording") -> None:
        if recording.holds_aliases():
            self.handed[id(recording)] = recording


class GraphReplay:
    """``reduce-overhead``: the compiled graph recorded once as a CUDA graph and replayed.

    Inputs are copied into static buffers before each replay (skipped when the caller passes those very
    buffers).  Outputs are handed out without a copy, and stay the caller's: see [Note: outputs of a replay].
    The first call runs normally (it also compiles every kernel); the second records the graph (on the caller's
    buffers if it passes those of an earlier call, else - at the next call with new addresses - on copies)."""

    WARMUP_CALLS = 1
    MAX_GRAPHS = 2  # graphs recorded on callers' own input buffers, before falling back to copies
    SETTLE_CALLS = 2  # calls in a row at one address before a copied input is read in place
    MAX_COPY_RECORDINGS = 4  # recordings of the graph on copies reading some inputs in place

    def __init__(self, module: "TritonGraph", on_record: Callable[[], None] | None = None,
                 report: CompileReport | None = None, pool: GraphPool | None = None):
        """``on_record``: called after each recording (a symbolic graph's report counts them over its sizes);
        ``report``: where a recording that fails says so; ``pool``: the memory pool shared with the other sizes
        of a symbolic graph ([Note: one memory pool for a symbolic graph's sizes]); None: a private one."""
        self.module = module
        self.on_record = on_record
        self.report = report
        self.pool = pool
        self.capture_error: str | None = None  # a recording failed: every call runs the plain module
        self.calls = 0
        # [Note: a training step replays one recording per graph] A training step's graphs form a chain: the
        # backward reads the forward's saved activations, which lie where the forward's recording writes its
        # outputs.  If the forward replayed one recording in one step and another in the next (a graph keyed by
        # the batch's address, whenever the allocator hands the batch a block seen before; the graph on copies
        # otherwise), the backward's inputs would change address from step to step and it could read none of
        # them in place - it would copy every saved activation, or record again.  So training graphs are never
        # keyed by address: each replays its graph on copies, which reads the inputs that keep their address
        # (parameters; once the forward replays, the saved activations) in place and copies the others (the
        # batch, the incoming gradient).  Inference graphs keep both kinds.
        self.keyed = not (report is not None and report.training)
        # [Note: graphs keyed by input addresses] A graph reads its inputs at the addresses it was recorded
        # with.  A caller that passes the same buffers again (same addresses, shapes and strides) gets a
        # replay with no input copy; other inputs are copied into the buffers of a graph recorded on copies.
        # A graph is recorded on the caller's own buffers only for addresses already seen in an earlier call:
        # a loop that passes fresh tensors each call (a decoding loop's growing cache) would otherwise record
        # ``MAX_GRAPHS`` graphs no later call replays, each recording costing milliseconds, before the copies.
        # The graph on copies is recorded at the second call whose addresses were new (the first runs plainly:
        # a caller that alternates two sets of buffers gets a graph on each, with no copies).
        self.graphs: dict[tuple, _Recording] = {}
        self.seen: list[tuple] = []  # input addresses of the latest calls that had no graph of their own
        self.seen_calls = 0  # (how many calls those were: one key seen in two calls is settled)
        self.misses = 0  # calls after the warm-up whose addresses had not been seen
        self.copy_graph: _Recording | None = None
        # [Note: a graph on copies reads settled inputs in place] The graph on copies copies only the inputs
        # whose address moves: one that came at the same address in every call seen (a parameter; a training
        # backward's saved activations, the forward replay's outputs) is read where the caller keeps it,
        # like the inputs of a graph keyed by addresses - a training step's forward would otherwise copy every
        # parameter into a second set of buffers before each replay.  ``in_place``: input -> the address the
        # graph reads; a call passing another tensor there drops the graph (the next miss records again).  An
        # input that is another recording's output (a training forward's saved activations, for the backward)
        # is read in place from the start; one copied so far that becomes such an output and keeps its address
        # for ``SETTLE_CALLS`` calls (the backward's activations, once the forward replays) has the graph
        # recorded again with it in place - no other input settles after a recording (a fresh batch the
        # allocator happens to place where the last one was would move again).  An input other than a
        # recording's output that moved after being read in place is copied from then on; after
        # ``MAX_COPY_RECORDINGS`` recordings a graph
        # that no longer fits is recorded once more with every input copied.  Only addresses are kept, never
        # the caller's tensors: a reference would keep a forward's output alias alive and make its next replay
        # copy it.
        self.static_inputs: list[torch.Tensor | None] = []  # the copies (None: read in place)
        self.in_place: dict[int, tuple] = {}  # input -> (address, strides) the graph reads
        self.streak: list[int] = []  # per copied input: calls in a row at the previous call's address
        self.last_addresses: list = []
        # ([Note: the steady call of a graph on copies]) per input: shape, dtype, and the address and strides the
        # graph on copies reads it at (None: copied)
        self.steady_inputs: list[tuple] = []
        self.copied: list[int] = []  # inputs the graph on copies copies
        self.moved: set[int] = set()  # inputs once read in place that came elsewhere later: copied for good
        # (off: every input of the graph on copies copied; a training graph always reads its parameters and saved
        # activations in place)
        self.settle = config.get().cuda_graph_inputs_in_place or not self.keyed
        self.copy_recordings = 0
        self.expected = [(n.shape, n.dtype) for n in module.graph.inputs]
        self.device_type = module.device.type  # (cuda; cpu where CUDA graphs are emulated)
        self._on_device = operator.attrgetter("is_cuda" if self.device_type == "cuda" else "is_cpu")
        self.unprotected_runs = 0  # calls run without the graph: the caller held views of earlier outputs
        # [Note: replaying a graph that updates its inputs] (a static KV cache's decode step) A graph recorded on
        # the caller's buffers updates them where they lie at each replay, as the plain call does.  Two things
        # differ from a pure graph: the warm-up run before a capture works on copies of the inputs it updates
        # (else the update would happen twice in the call that records: wrong for ``count += 1``), and a replay
        # of the graph recorded on copies copies the updated inputs back into the caller's tensors.
        self.updated = [k for k, _, n in module.input_slots if n in module.mutated_inputs]

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.copy_graph is not None and not self.keyed and self.capture_error is None \
                and profiling.current() is None:
            outputs = self._steady_call(inputs)
            if outputs is not None:
                return outputs
        for k, (x, (shape, dtype)) in enumerate(zip(inputs, self.expected)):
            if tuple(x.shape) != shape or x.dtype != dtype or x.device.type != self.device_type:
                raise InputMismatch(k, dtype, shape, self.device_type, x)
            if not self.settle and not x.is_contiguous():
                return self.module(inputs)  # (strided inputs replay only with cuda_graph_inputs_in_place, for now)
        self.calls += 1
        # (an input's strides are part of its key: a graph recorded on a strided input - a slice of a batch, a
        # channels-last activation a backward saved - reads that layout; the graph on copies copies any layout
        # into its own buffers, which keep the layout of the input they were cloned from where it is dense)
        key = tuple((x.data_ptr(), x.stride()) for x in inputs)
        if self.calls <= self.WARMUP_CALLS or profiling.current() is not None or self.capture_error:
            self._saw(key)
            return self.module(inputs)  # (kiln.profile: step by step)
        entry = self.graphs.get(key)
        try:
            if entry is None and self.keyed and len(self.graphs) < self.MAX_GRAPHS and key in self.seen:
                entry = self.graphs[key] = self._record(list(inputs))
            elif entry is None:
                self._saw(key)
                moved = {k for k, a in self.in_place.items() if key[k] != a}
                if self.copy_graph is not None and moved:
                    self.moved |= moved  # (copied from now on)
                    self.copy_graph, self.misses = None, 0
                if self.copy_graph is None:
                    self.misses += 1
                    if self.misses < 2:  # one more plain call: these addresses may come again
                        return self.module(inputs)
                    settled = self._settled_in_every_call_seen(key, inputs)
                    self._record_copy_graph(inputs, key, settled if self.copy_recordings < self.MAX_COPY_RECORDINGS
                                            else set())
                else:
                    settled = self._settled_since_recording(key, inputs)
                    if settled and self.copy_recordings < self.MAX_COPY_RECORDINGS:
                        self._record_copy_graph(inputs, key, set(self.in_place) | settled)
        except Exception as exc:  # noqa: BLE001 - never break the user's model: run it without CUDA graphs
            # (an op that cannot be captured - one that waits for the device - fails only when recorded)
            self.capture_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if self.report is not None:
                self.report.memory["cuda_graph"] = f"not used: recording failed ({self.capture_error})"
            warnings.warn(f"kiln: a CUDA graph recording failed, the graph runs without CUDA graphs: "
                          f"{self.capture_error}", stacklevel=2)
            return self.module(inputs)
        if entry is None:
            for static, x in zip(self.static_inputs, inputs):
                if static is not None:
                    static.copy_(x)
            entry = self.copy_graph
        return self._replay(entry, inputs)

    def _steady_call(self, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """[Note: the steady call of a graph on copies] A training step's graphs replay their graph on copies at
        every call ([Note: a training step replays one recording per graph]), and the host time of a replay is
        part of the step: GPT-small's forward and backward have 60-90 inputs and outputs each, and the general
        call below - a key of every input's address, the addresses seen, the set of inputs moved, every input's
        streak - took ~0.5 ms a call on the host.  Here the same decisions for that state alone, each input
        looked at once: the inputs read in place must lie where the graph reads them, and the copied ones
        (the batch, the incoming gradient) keep their streaks; anything else - an input in place that moved, a
        copied one that settled, a mismatch to report - returns None before changing any state, and the general
        call takes it."""
        on_device = self._on_device
        for x, (shape, dtype, pointer, strides) in zip(inputs, self.steady_inputs):
            if x.dtype is not dtype or x.shape != shape or not on_device(x) \
                    or pointer is not None and (x.data_ptr() != pointer or x.stride() != strides):
                return None
        streaks = []
        for k in self.copied:
            x = inputs[k]
            address = (x.data_ptr(), x.stride())
            streak = self.streak[k] + 1 if address == self.last_addresses[k] else 0
            if streak >= self.SETTLE_CALLS and self.copy_recordings < self.MAX_COPY_RECORDINGS \
                    and _recorded_output(x):
                return None  # (settled: recorded again with it in place)
            streaks.append((k, streak, address))
        self.calls += 1
        for k, streak, address in streaks:
            self.streak[k] = streak
            self.last_addresses[k] = address
        if self.copied:
            torch._foreach_copy_([self.static_inputs[k] for k in self.copied], [inputs[k] for k in self.copied])
        return self._replay(self.copy_graph, inputs)

    def _replay(self, entry: "_Recording", inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Replay ``entry`` (its copied inputs already copied) and hand out its outputs."""
        if not (entry.release_outputs() if self.pool is None else self.pool.release()):
            self.unprotected_runs += 1
            return self.module(inputs)
        entry.replay(inputs)
        if entry is self.copy_graph:
            for k in self.updated:
                if self.static_inputs[k] is not None:
                    inputs[k].copy_(self.static_inputs[k])
        outputs = entry.hand_out(inputs)
        if self.pool is not None:
            self.pool.note_handed(entry)
        return outputs

    def _settled_in_every_call_seen(self, key: tuple, inputs: list[torch.Tensor]) -> set[int]:
        """Inputs at the same address in every call seen without a graph of its own (this one included) that
        never moved after being read in place, and inputs that are another recording's outputs (they stay where
        that recording writes them, for as long as it lives)."""
        if not self.settle:
            return set()
        recorded = {k for k, x in enumerate(inputs) if _recorded_output(x)}
        if self.seen_calls < 2:
            return recorded
        return recorded | ({k for k, a in enumerate(key) if all(s[k] == a for s in self.seen)} - self.moved)

    def _settled_since_recording(self, key: tuple, inputs: list[torch.Tensor]) -> set[int]:
        """Copied inputs that are another recording's outputs and came at the previous call's address
        ``SETTLE_CALLS`` calls in a row (a backward's saved activations, once the forward replays).  Nothing
        else settles after the recording: a fresh tensor the allocator happens to place where the previous one
        was (a batch, an incoming gradient) would move again, and each move records the graph once more."""
        if not self.settle:
            return set()
        for k, a in enumerate(key):
            if k not in self.in_place:
                self.streak[k] = self.streak[k] + 1 if a == self.last_addresses[k] else 0
        self.last_addresses = list(key)
        return {k for k, n in enumerate(self.streak)
                if n >= self.SETTLE_CALLS and k not in self.in_place and _recorded_output(inputs[k])}

    def _record_copy_graph(self, inputs: list[torch.Tensor], key: tuple, in_place: set[int]) -> None:
        """([Note: a graph on copies reads settled inputs in place]) Record the graph on copies of the inputs
        outside ``in_place``, the others read at the caller's addresses (``key``: this call's)."""
        self.copy_graph = None  # (the previous recording's copies and pool go first)
        self.static_inputs = [x if k in in_place else x.clone() for k, x in enumerate(inputs)]
        self.copy_graph = self._record(list(self.static_inputs))
        self.copy_recordings += 1
        self.in_place = {k: key[k] for k in in_place}
        self.static_inputs = [None if k in in_place else x for k, x in enumerate(self.static_inputs)]
        self.streak = [0] * len(inputs)
        self.last_addresses = list(key)
        # ([Note: the steady call of a graph on copies])
        self.steady_inputs = [(torch.Size(shape), dtype, *self.in_place.get(k, (None, None)))
                              for k, (shape, dtype) in enumerate(self.expected)]
        self.copied = [k for k, x in enumerate(self.static_inputs) if x is not None]

    def _saw(self, key: tuple) -> None:
        """Remember the input addresses of a call without a graph of its own (the last ``MAX_GRAPHS + 2``)."""
        self.seen_calls += 1
        if key not in self.seen:
            self.seen = [*self.seen[-(self.MAX_GRAPHS + 1):], key]

    def _record(self, inputs: list[torch.Tensor]) -> "_Recording":
        if self.device_type != "cuda":
            recording = _EmulatedGraph.record(self.module, inputs, self.updated)
            if self.on_record is not None:
                self.on_record()
            return recording
        stream = _capture_stream(inputs[0].device if inputs else torch.device("cuda"))
        stream.wait_stream(torch.cuda.current_stream())
        # [Note: cuBLAS workspace of a recording] cuBLAS keeps a workspace (32 MiB on Hopper) per stream,
        # allocated at its first call there and held for good.  Cleared around the warm-up and the capture,
        # the workspace the recording uses is allocated during the capture, from the graph's private pool,
        # and handed back to that pool after it: the graph owns it and no stream holds another one for us.
        with _cublas_workspaces_cleared(), torch.cuda.stream(stream):  # warm-up: library handles, plans
            self.module([x.clone() if k in self.updated else x for k, x in enumerate(inputs)])
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        pool = None
        if self.pool is not None:
            if self.pool.handle is None:
                self.pool.handle = torch.cuda.graph_pool_handle()
            pool = self.pool.handle
        with _cublas_workspaces_cleared(), torch.cuda.graph(graph, pool=pool, stream=stream):
            outputs = self.module(inputs)
        if self.on_record is not None:
            self.on_record()
        return _Recording(graph, outputs, inputs)


def _without_base(o: torch.Tensor) -> torch.Tensor:
    """``o``'s memory, shape and strides in a tensor that is no view of another."""
    if o._base is None:
        return o
    with torch.no_grad():
        own = torch.empty(0, dtype=o.dtype, device=o.device)
        own.set_(o.untyped_storage(), o.storage_offset(), o.shape, o.stride())
    return own


def _view_of_input(o: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[int, tuple, int] | None:
    """([Note: outputs that are inputs]) (input index, that input's strides, ``o``'s offset from it) where
    output ``o`` is a view lying within input ``j``'s elements (same dtype), else None."""
    if min(o.stride(), default=0) < 0:
        return None
    p = o.untyped_storage().data_ptr()
    o_lo, o_hi = _extent(o)
    for j, x in enumerate(inputs):
        if x.untyped_storage().data_ptr() != p or x.dtype != o.dtype or min(x.stride(), default=0) < 0:
            continue
        lo, hi = _extent(x)
        if lo <= o_lo and o_hi <= hi:
            return j, x.stride(), o.storage_offset() - x.storage_offset()
    return None


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The first and last storage elements ``t`` reaches (non-negative strides)."""
    if t.numel() == 0:
        return t.storage_offset(), t.storage_offset() - 1
    return t.storage_offset(), t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


# [Note: a graph on copies reads settled inputs in place]: the outputs of every live recording, by storage (each
# recording's static outputs live as long as it does; an alias of one moved onto a copy has another storage)
_recorded_outputs: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def _recorded_output(x: torch.Tensor) -> bool:
    """Is ``x`` on the storage of a live recording's output (written at the same address at every replay)?"""
    return _recorded_outputs.get(x.untyped_storage().data_ptr()) is not None


class _Recording:
    """One CUDA graph and the static outputs it writes.

    [Note: outputs of a replay] Each replay writes the same output buffers.  The caller gets an alias of each
    (a second tensor on the same storage, no copy), and may keep it: before the next replay overwrites the
    buffer, an alias still alive is moved onto a copy of its values (``set_``: the caller's tensor object
    keeps its values, only its storage changes), and one that was dropped costs nothing.  The usual
    ``out = model(x)`` loop holds the previous output during the call, so it pays one copy; a caller that
    drops outputs first pays none.  If the caller holds views of an output (which cannot be moved), the call
    runs without the graph, on fresh buffers.  Outputs that share storage with an input or with each other
    are handed out as copies."""

    def __init__(self, graph: torch.cuda.CUDAGraph, outputs: list[torch.Tensor], inputs: list[torch.Tensor]):
        self.graph = graph
        storages = [o.untyped_storage().data_ptr() for o in outputs]
        taken = {x.untyped_storage().data_ptr() for x in inputs}
        self.aliased = [storages.count(p) == 1 and p not in taken for p in storages]
        # An output that is a view of a buffer of the module's (a reshape of a matrix product's result) keeps
        # that buffer's tensor alive as its base, which would count as a view the caller holds: before each
        # replay the call would run without the graph (a GPT forward's every call).  The recording keeps the
        # output's memory through a tensor of its own instead, and the base goes.
        self.outputs = [_without_base(o) if alias else o for o, alias in zip(outputs, self.aliased)]
        self.handed: dict[int, weakref.ref] = {}  # output -> its alias handed out, not yet released
        self.of_input = [_view_of_input(o, inputs) for o in outputs]
        for o, alias in zip(self.outputs, self.aliased):
            if alias:  # (outputs handed out as copies are never read where they lie)
                _recorded_outputs[o.untyped_storage().data_ptr()] = o
        # (each output's storage held, so that its owners are counted without making a storage object per call:
        # the static tensor and this one are two of them)
        self.storages = [o.untyped_storage() for o in self.outputs]
        self.storage_ids = [st._cdata for st in self.storages]
        self._hand_out_plan = [self._plan_output(k, o, inputs) for k, o in enumerate(self.outputs)]

    def _plan_output(self, k: int, o: torch.Tensor, inputs: list[torch.Tensor]) -> tuple:
        """How ``hand_out`` makes output ``k``: ("input", j, strides): the call's input ``j`` itself (its very layout,
        when the call's has ``strides``), ("view", j, strides, offset, shape, own strides): a view of it, ("alias",):
        an alias of the static output, ("copy",): a copy."""
        source = self.of_input[k]
        if source is not None:
            j, stride, delta = source
            x = inputs[j]
            if delta == 0 and o.shape == x.shape and o.stride() == x.stride():
                return ("input", j, stride)
            return ("view", j, stride, delta, o.shape, o.stride())
        return ("alias",) if self.aliased[k] else ("copy",)

    def release_outputs(self) -> bool:
        """Make the static outputs free to overwrite; False if the caller holds a view we cannot move."""
        uses = torch._C._storage_Use_Count
        for k, ref in list(self.handed.items()):
            alias = ref()
            holders = uses(self.storage_ids[k]) - 2  # minus the static tensor itself and our storage object
            if alias is None:
                if holders:
                    return False
                del self.handed[k]
                continue
            if holders != 1:
                return False
            copy = alias.clone()
            version = None if alias.is_inference() else alias._version  # (inference tensors have no counter)
            # (without grad mode: recorded by autograd, ``set_`` would replace the output's grad_fn, and a
            # gradient taken through the moved output later would find no backward)
            with torch.inference_mode(alias.is_inference()), torch.no_grad():
                alias.set_(copy.untyped_storage(), copy.storage_offset(), copy.shape, copy.stride())
            if version is not None:
                _keep_version(alias, version)
            del self.handed[k]
        return True

    def replay(self, inputs: list[torch.Tensor]) -> None:
        """Replay the graph (``inputs``: the call's, which an emulated graph reads where a CUDA graph would)."""
        if isinstance(self.graph, _EmulatedGraph):
            self.graph.replay(inputs)
        else:
            self.graph.replay()

    def holds_aliases(self) -> bool:
        """Has an output been handed out as an alias that may still be alive (not yet released)?"""
        return bool(self.handed)

    def hand_out(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The call's outputs (``inputs``: the call's).  [Note: outputs that are inputs] An output that views
        one of the graph's inputs (a training forward returns the parameters and the batch its backward needs) is
        that view of the caller's input, as a plain call returns it - not a copy of the graph's buffer: a copy
        would cost each parameter's bytes at every step, and the backward, seeing a new address each step, would
        copy it once more instead of reading it in place.  An output that is a whole input is the caller's
        tensor itself, as the plain call returns it (a view made per call cost ~3 us of host time each, GPT's
        forward returns 20 parameters)."""
        result = []
        handed = self.handed
        for k, plan in enumerate(self._hand_out_plan):
            kind = plan[0]
            if kind == "input" or kind == "view":
                x = inputs[plan[1]]
                if x.stride() == plan[2]:
                    result.append(x if kind == "input" else
                                  x.detach().as_strided(plan[4], plan[5], x.storage_offset() + plan[3]))
                    continue
                kind = "alias" if self.aliased[k] else "copy"
            o = self.outputs[k]
            if kind == "alias":
                alias = o.detach()
                handed[k] = weakref.ref(alias)
                result.append(alias)
            else:
                result.append(o.clone())
        return result


class _EmulatedGraph:
    """[Note: CUDA graphs emulated on the CPU] ``Config.emulate_cuda_graphs`` runs GraphReplay's logic - graphs
    keyed by input addresses, graphs on copies reading settled inputs in place, outputs handed out as aliases and
    moved before the next replay - over CPU modules, so that tests and ``benchmarks/cuda_graph_replays.py`` can
    see, without a GPU, which calls of a real workload (a training loop, a decoding loop) replay and which run
    plainly or record again.  A CUDA graph's replay reruns the recorded kernels at the recorded addresses: it
    reads the input buffers as they are at the replay and writes the same output buffers every time.  This
    stands in for one: ``replay`` reruns the module on what lies at the recorded input addresses and copies its
    results into the recorded outputs.  Not emulated: intermediates in a private memory pool (the module allocates as it
    always does), and an output that views an input the graph updates views a copy of it here (the recording
    run works on copies of updated inputs, as the real warm-up does, so that the update happens once, at the
    replay).  Slower than a plain call (a copy per output): for diagnosis and tests, never for speed."""

    def __init__(self, module: Callable, inputs: list[torch.Tensor], outputs: list[torch.Tensor]):
        self.module = module
        # what a CUDA graph keeps of its inputs is their addresses: a reference would keep a caller's tensor
        # alive, and follow it where ``set_`` moves it (a held output moved onto a copy), where the graph does not
        self.addresses = [(x.data_ptr(), x.stride()) for x in inputs]
        self.inputs = [weakref.ref(x) for x in inputs]  # (alive and in place: GraphReplay's copies)
        self.outputs = outputs

    @classmethod
    def record(cls, module: Callable, inputs: list[torch.Tensor], updated: list[int]) -> "_Recording":
        outputs = list(module([x.clone() if k in updated else x for k, x in enumerate(inputs)]))
        # A CPU module keeps its latest output buffers for reuse ([Note: output recycling]): one kept there would
        # count as a view the caller holds, and a later call could write over it.  A CUDA graph's outputs belong
        # to the graph alone: so do these (only the recycling is dropped - anything else of the module's that
        # holds an output's memory stays visible, as it would on the GPU).
        storages = {o.untyped_storage().data_ptr() for o in outputs}
        for pool in getattr(module, "_pools", ()):
            pool[:] = [t for t in pool if t.untyped_storage().data_ptr() not in storages]
        recording = _Recording(cls(module, inputs, []), outputs, inputs)
        recording.graph.outputs = recording.outputs
        return recording

    def replay(self, inputs: list[torch.Tensor]) -> None:
        """Rerun the module on what lies at the recorded addresses: the call's input where it is there (a graph
        on the caller's buffers, an input read in place), else the tensor recorded there (a copy of GraphReplay's).
        An address holding neither is one a CUDA graph would read stale or freed memory at: an error here."""
        read = []
        for k, (address, ref) in enumerate(zip(self.addresses, self.inputs)):
            x = inputs[k] if (inputs[k].data_ptr(), inputs[k].stride()) == address else ref()
            if x is None or (x.data_ptr(), x.stride()) != address:
                raise RuntimeError(f"kiln: an emulated CUDA graph's input {k} is no longer at the address it was "
                                   f"recorded with: a CUDA graph would read stale memory there")
            read.append(x)
        for static, value in zip(self.outputs, self.module(read)):
            if static.data_ptr() != value.data_ptr() or static.stride() != value.stride():
                # written through a tensor of its own: a CUDA graph's replay bumps no version counter, and the
                # outputs' aliases share the static tensor's (autograd saved them: a bump would fail the backward)
                writer = torch.empty(0, dtype=static.dtype)
                writer.set_(static.untyped_storage(), static.storage_offset(), static.shape, static.stride())
                for d, step in enumerate(static.stride()):  # (an expanded output: its buffer's elements once)
                    if step == 0:
                        writer, value = writer.narrow(d, 0, min(1, writer.shape[d])), \
                            value.narrow(d, 0, min(1, value.shape[d]))
                writer.copy_(value)
                del writer


def _keep_version(t: torch.Tensor, version: int) -> None:
    """Put ``t``'s version counter back after ``set_`` moved it onto a copy of its own values: autograd saved it
    for a backward (a training forward's output, read by the loss's backward; gradient accumulation's first
    forward, whose activations the second forward's replay moves) and would refuse the tensor as modified in
    place, though no value changed."""
    if t.is_inference() or t._version == version:
        return
    setter = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
    if setter is None:
        return
    try:
        setter((t,), (version,))
    except TypeError:  # (an older signature: one tensor, one version)
        setter(t, version)


@contextlib.contextmanager
def _cublas_workspaces_cleared() -> Iterator[None]:
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    try:
        yield
    finally:
        if clear is not None:
            clear()


_capture_streams: dict[torch.device, torch.cuda.Stream] = {}


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every recording: cuBLAS keeps a workspace (32 MiB on Hopper) per
    stream it has run on, so a fresh stream per graph would hold one more workspace each time."""
    if device not in _capture_streams:
        _capture_streams[device] = torch.cuda.Stream(device)
    return _capture_streams[device]


def with_cuda_graph(module: "TritonGraph", report: CompileReport, mode: str,
                    on_record: Callable[[], None] | None = None, pool: GraphPool | None = None) -> Callable:
    """``module`` replayed as a CUDA graph in the modes that record one (reduce-overhead, max-autotune);
    ``on_record`` is called after each recording; ``pool``: a memory pool shared with other modules (the sizes
    of one symbolic graph)."""
    if mode in ("reduce-overhead", "max-autotune") and (module.device.type == "cuda"
                                                        or config.get().emulate_cuda_graphs):
        report.memory["cuda_graph"] = "recorded at the second call, replayed after" + (
            " (updating the caller's inputs in place)" if module.mutated_inputs else "")
        return GraphReplay(module, on_record, report, pool)
    return module

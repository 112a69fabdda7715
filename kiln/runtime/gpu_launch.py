"""kiln's launcher for compiled Triton kernels: one C call into the CUDA driver per launch, no Python in between.

[Note: static launch] Triton's own launcher is a Python function: per launch it asks for the current device and
stream, builds launch metadata, checks hooks and scratch sizes, then calls a C function that reads every
argument's ``data_ptr`` back through Python: 7-10 us of host time per launch on the H200 machine, and a small
model's call in default mode is host-bound (GPT: 46 kernels, 17 of them Triton launches, about 1.2 ms of host
time issuing 0.18 ms of kernels).

A kernel kiln compiled ahead (``TritonGraph._precompile``) has a fixed grid, fixed launch parameters and
takes only buffer pointers (kiln's kernels bake every size in).  So everything but the pointers is known at
build time: it goes into a ``KilnLaunch`` record once, and a launch is the generated wrapper passing the
tensors to the extension's ``launch`` (a CPython function in C: it reads each ``data_ptr``, checks the
alignment the kernel was compiled for, fills the parameter array and calls ``cuLaunchKernel``)::

    before (generated wrapper)                    after
      RUN_4(v9, v12, 1024, 1)  # Triton's runner       failed = LAUNCH_4(stream, v9, v12)
                                                       if failed:  # misaligned -> Triton's JIT entry, or an error
                                                           RETRY_5(failed, (v9, v12))

Measured on the H200 machine (host time per launch of a small kernel, GPU kept busy; ``benchmarks/host_time.py
--launches``, one run): Triton's JIT entry 10.8 us, Triton's compiled runner 9.6 us, this launcher 4.9 us (4.2 us
per kernel when ten go in one call).

A kernel with size parameters ([Note: GPU kernels with size parameters]) gets a record per size: its int
parameters (and fp32 ones, floats computed from sizes) are fixed values of the record, as its grid is.  Kernels
a record cannot describe (a scalar it was not given, thread-block clusters, cooperative or PDL launches, a
scratch buffer Triton allocates per launch) keep Triton's launcher.  The driver is reached through the
``cuLaunchKernel`` found in ``libcuda.so.1``; a launch recorded into a CUDA graph
works as any other (stream capture sees driver calls).
"""
from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any, Callable

import torch

MAX_ARGS = 64

_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*cu_launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                           void**, void**);
static cu_launch_t cu_launch = 0;
static PyObject* data_ptr_name = 0;

#define KILN_MAX_ARGS %(max_args)d
struct KilnLaunch {
  void* function;                  // the CUfunction Triton loaded
  uint32_t grid_x, grid_y, grid_z;
  uint32_t threads, shared;        // threads per block (32 x warps), dynamic shared memory in bytes
  int32_t nargs;                   // kernel parameters, Triton's scratch pointers included
  int32_t slot[KILN_MAX_ARGS];     // parameter i: the slot[i]-th tensor's data, or value[i] when negative
  uint64_t value[KILN_MAX_ARGS];   // a parameter's fixed value: an int size (read as its i32/i64 low bytes), 0
};

// launch(records, count, stream, *tensors): launch `count` recorded kernels in order on `stream`, each pointer
// parameter the data of one of `tensors`.  0; -1 (nothing launched) when a tensor's data is not 16-byte
// aligned (the kernels were compiled for aligned buffers); else the CUDA error of the first failing launch in
// the low 32 bits with its index above them.
static PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 3 || nargs - 3 > KILN_MAX_ARGS) {
    PyErr_SetString(PyExc_TypeError, "kiln launch(records, count, stream, *tensors)");
    return NULL;
  }
  const KilnLaunch* launches = (const KilnLaunch*)PyLong_AsVoidPtr(args[0]);
  long count = PyLong_AsLong(args[1]);
  void* stream = PyLong_AsVoidPtr(args[2]);
  if (PyErr_Occurred()) return NULL;
  uint64_t table[KILN_MAX_ARGS];
  for (Py_ssize_t i = 3; i < nargs; ++i) {
    PyObject* ptr = PyObject_CallMethodNoArgs(args[i], data_ptr_name);
    if (ptr == NULL) return NULL;
    table[i - 3] = PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    if (PyErr_Occurred()) return NULL;
    if (table[i - 3] & 15) return PyLong_FromLong(-1);
  }
  for (long k = 0; k < count; ++k) {
    const KilnLaunch& l = launches[k];
    uint64_t values[KILN_MAX_ARGS];
    void* params[KILN_MAX_ARGS];
    for (int32_t i = 0; i < l.nargs; ++i) {
      values[i] = l.slot[i] >= 0 ? table[l.slot[i]] : l.value[i];
      params[i] = &values[i];
    }
    int err = cu_launch(l.function, l.grid_x, l.grid_y, l.grid_z, l.threads, 1, 1, l.shared, stream, params, 0);
    if (err != 0) return PyLong_FromLongLong(((long long)k << 32) | (uint32_t)err);
  }
  return PyLong_FromLong(0);
}

static PyObject* set_driver(PyObject* self, PyObject* arg) {
  cu_launch = (cu_launch_t)PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
  {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(records, count, stream, *tensors)"},
  {"set_driver", set_driver, METH_O, "set_driver(address of cuLaunchKernel)"},
  {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kiln_gpu_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_kiln_gpu_launch(void) {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  return PyModule_Create(&module);
}
""" % {"max_args": MAX_ARGS}


class KilnLaunch(ctypes.Structure):
    _fields_ = [("function", ctypes.c_void_p), ("grid_x", ctypes.c_uint32), ("grid_y", ctypes.c_uint32),
                ("grid_z", ctypes.c_uint32), ("threads", ctypes.c_uint32), ("shared", ctypes.c_uint32),
                ("nargs", ctypes.c_int32), ("slot", ctypes.c_int32 * MAX_ARGS), ("value", ctypes.c_uint64 * MAX_ARGS)]


@functools.lru_cache(maxsize=None)
def _extension() -> Any:
    """The launch extension bound to the driver's ``cuLaunchKernel``; None where either is missing."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        address = ctypes.cast(driver.cuLaunchKernel, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    ext = build_extension()
    if ext is not None:
        ext.set_driver(address)
    return ext


@functools.lru_cache(maxsize=None)
def build_extension() -> Any:
    """The launch extension, a CPython module built (once, then from kiln's build cache) from ``_SOURCE``; None
    where it does not build."""
    import importlib.machinery
    import importlib.util
    import sysconfig
    from kiln.runtime.build import KilnBuildError, load_module
    include = sysconfig.get_paths()["include"]
    try:
        built = load_module(_SOURCE, name="kiln_gpu_launch", extra_flags=(f"-I{include}",))
    except KilnBuildError:
        return None
    loader = importlib.machinery.ExtensionFileLoader("kiln_gpu_launch", built.load_path or built.path)
    spec = importlib.util.spec_from_file_location("kiln_gpu_launch", loader.path, loader=loader)
    ext = importlib.util.module_from_spec(spec)
    loader.exec_module(ext)
    return ext


def available() -> bool:
    """Is kiln's launcher usable here (a CUDA driver, the helper built)?"""
    return torch.cuda.is_available() and _extension() is not None


def describable(compiled: Any) -> bool:
    """Can a launch record describe launches of Triton ``compiled`` kernel (see ``record``)?"""
    md = compiled.metadata
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False) \
            or getattr(md, "launch_pdl", False) or getattr(md, "global_scratch_size", 0) \
            or getattr(md, "profile_scratch_size", 0):
        return False
    kinds = [t for t in compiled.src.signature.values() if t != "constexpr"]
    # another scalar (or a tensor descriptor): Triton's launcher passes it
    return all(isinstance(t, str) and (t.startswith("*") or t in _SCALARS) for t in kinds) \
        and len(kinds) + 2 <= MAX_ARGS


_SCALARS = ("i32", "i64", "fp32")  # the scalar parameters a record passes: a size's value or a float computed
# from sizes, fixed per launch record


def load_function(compiled: Any, device: torch.device) -> Any:
    """Load Triton ``compiled`` kernel's binary into the current context, the way Triton's own first launch
    does, but without building Triton's launcher: the CUfunction handle, or None where it cannot be loaded
    here (too much shared memory, too many threads; any error).

    [Note: no Triton launcher] Triton loads a kernel's binary and builds its C launcher together, at the first
    launch: the launcher is a C file per argument signature through the host compiler (0.1-0.3 s each, a
    graph's worth of them most of its cold kernel-compile time on the H200 machine).  A kernel kiln launches
    itself needs only the loaded function; Triton's launcher is built when a misaligned buffer first needs it
    (``_Launcher.runner``)."""
    try:
        from triton.runtime import driver
        md = compiled.metadata
        index = device.index if device.index is not None else torch.cuda.current_device()
        if md.shared > driver.active.utils.get_device_properties(index)["max_shared_mem"]:
            return None
        _, function, _, _, max_threads = driver.active.utils.load_binary(compiled.name, compiled.kernel,
                                                                         md.shared, index)
        return function if md.num_warps * 32 <= max_threads else None
    except Exception:  # noqa: BLE001 - Triton's own launch path then loads it (and reports what is wrong)
        return None


def function_of(compiled: Any, device: torch.device) -> Any:
    """``load_function``'s answer for ``compiled`` on ``device``, loaded once per process: every module that
    launches the kernel (each size of a symbolic graph, each compile of a graph Triton's cache answered) shares
    the one loaded binary, instead of loading another copy into the context per module (a decoding loop builds a
    module per new length)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (id(compiled), index)
    hit = _functions.get(key)
    if hit is None:
        hit = _functions[key] = (compiled, load_function(compiled, device))  # (holding it keeps its id unique)
    return hit[1]


_functions: dict[tuple[int, int], tuple[Any, Any]] = {}


def record(compiled: Any, grid: tuple[int, int, int], slots: list[int], function: Any = None,
           scalars: dict[str, int | float] | None = None) -> KilnLaunch | None:
    """The launch record of Triton ``compiled`` kernel over ``grid``, its pointer parameters read from table
    entries ``slots`` (in the kernel's parameter order, constexprs left out), its int and fp32 parameters the
    values of ``scalars`` by parameter name (a kernel with size parameters, [Note: GPU kernels with size parameters]: one
    record per size; a size Triton specialized to a constant is no parameter); ``function`` is its loaded
    CUfunction (default: the one Triton loaded, ``compiled.function``).  None where the record cannot
    describe the launch."""
    md = compiled.metadata
    function = function if function is not None else getattr(compiled, "function", None)
    if function is None or not describable(compiled):
        return None
    scalars = scalars or {}
    params: list[tuple[int, int]] = []  # (slot, fixed value)
    pointers = iter(slots)
    for name, kind in compiled.src.signature.items():
        if kind == "constexpr":
            continue
        if kind.startswith("*"):
            slot = next(pointers, None)
            if slot is None:
                return None
            params.append((slot, 0))
        elif name in scalars:
            value = scalars[name]
            if kind == "fp32":  # (a float computed from sizes: its fp32 bits)
                value = struct.unpack("<I", struct.pack("<f", float(value)))[0]
            params.append((-1, int(value)))
        else:
            return None
    if next(pointers, None) is not None:
        return None
    params += [(-1, 0), (-1, 0)]  # Triton 3.x appends the global and profile scratch pointers, null here
    out = KilnLaunch()
    out.function = function
    out.grid_x, out.grid_y, out.grid_z = grid
    out.threads = 32 * md.num_warps
    out.shared = md.shared
    out.nargs = len(params)
    for i, (slot, value) in enumerate(params):
        out.slot[i] = slot
        out.value[i] = value & 0xFFFFFFFFFFFFFFFF  # (a negative i64 as its two's complement)
    return out


def stream_getter(device: torch.device) -> Callable[[], int]:
    """A function returning the device's current CUDA stream handle (what the launch goes to)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if raw is not None:
        return functools.partial(raw, index)
    return lambda: torch.cuda.current_stream(device).cuda_stream


class Launch:
    """Recorded launches issued together: ``call(stream, *tensors)`` -> 0 or a code for ``retry``."""

    def __init__(self, records: list[KilnLaunch], names: list[str], fallback: Callable[[tuple], None]):
        self.records = (KilnLaunch * len(records))(*records)
        self.names = names
        self.fallback = fallback  # launches the same kernels for buffers that are not 16-byte aligned
        # the extension's function with the records bound: the generated wrapper calls it directly
        self.call = functools.partial(_extension().launch, ctypes.addressof(self.records), len(records))
        self.call.records = self.records  # the call holds the records it points at (the wrapper keeps only it)

    def retry(self, code: int, tensors: tuple) -> None:
        """After ``call`` answered ``code``: launch through ``fallback`` (a buffer not aligned), or raise."""
        if code == -1:
            self.fallback(tensors)
            return
        index, err = code >> 32, code & 0xFFFFFFFF
        name = self.names[index] if 0 <= index < len(self.names) else "?"
        raise RuntimeError(f"kiln: launching kernel {name} failed with CUDA driver error {err}")

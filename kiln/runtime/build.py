"""Compile generated C++ into a shared library, cache it on disk, and load it with ctypes.

Layout of the cache (``cfg.cache_dir``)::

    <cache_dir>/<key[:2]>/<key>/module.so     the built library
                               /source.cpp    the source it was built from (for humans / explain)
                               /meta.json     key, sha256 and size of module.so, compiler, flags, created time
    <cache_dir>/locks/<key>.lock              per-key flock: one process compiles a given module at a time
    <cache_dir>/tmp/<key[:16]>-<pid>-*/       private build dirs, renamed into place when complete
    <cache_dir>/trash/                        corrupt entries are moved here, then deleted
    <cache_dir>/failed/<key>/                 source.cpp + stderr.txt of the last failing compile of <key>

The key is the sha256 of the source, the compiler (resolved path and ``--version`` line), the flags, the kiln
version and :data:`FORMAT_VERSION`.  An entry is only ever published complete (``os.rename`` of a finished
directory), and is only loaded after its ``module.so`` matches the size and sha256 recorded in ``meta.json``;
anything else is moved aside and rebuilt.
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kiln import config

__all__ = [
    "FORMAT_VERSION",
    "BuildStats",
    "CompiledModule",
    "KilnBuildError",
    "build_stats",
    "builds",
    "clear_memo",
    "compiler_info",
    "load_module",
]

# Bump when the entry layout, meta.json schema or the way modules are built changes: old entries are then ignored.
FORMAT_VERSION = 1
# The compiler gets this long before the build is abandoned (a hung compiler would otherwise hold the key's lock).
COMPILE_TIMEOUT_S = 900
# Build dirs under <cache_dir>/tmp older than this are assumed abandoned (a crashed process) and swept.
STALE_TMP_S = 6 * 3600
# How many lines of compiler output go into a KilnBuildError message.
ERROR_LINES = 60

_SO_NAME = "module.so"
_SOURCE_NAME = "source.cpp"
_META_NAME = "meta.json"
_LINK_FLAGS = ("-lm",)


class KilnBuildError(RuntimeError):
    """The C++ compiler failed (or could not be run) on generated source."""

    def __init__(self, message: str, *, cmd: list[str] | None = None, returncode: int | None = None,
                 stderr: str = "", source_path: str | None = None):
        super().__init__(message)
        self.cmd = cmd
        self.returncode = returncode
        self.stderr = stderr
        self.source_path = source_path


@dataclasses.dataclass
class BuildStats:
    """Process-wide counters. ``compiles`` counts compiler invocations (failed ones included)."""

    compiles: int = 0
    cache_hits: int = 0  # loaded from the on-disk cache
    memo_hits: int = 0  # returned from the in-process memo
    rebuilds: int = 0  # corrupt / half-written entries discarded
    failures: int = 0  # compiler invocations that failed
    compile_seconds: float = 0.0

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


build_stats = BuildStats()


@dataclasses.dataclass(eq=False)
class CompiledModule:
    """A loaded module. Symbols resolve through ``.lib`` (``mod.lib.add``) or directly (``mod.add``)."""

    lib: ctypes.CDLL
    path: str  # the cache entry's module.so
    key: str
    from_cache: bool
    compile_seconds: float  # spent compiling in this call (0.0 when loaded from the cache)
    name: str = "kiln_module"
    load_path: str = ""  # the path actually dlopen'ed (differs from .path only when a stale handle was avoided)
    meta: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def entry_dir(self) -> str:
        return os.path.dirname(self.path)

    @property
    def source_path(self) -> str:
        return os.path.join(self.entry_dir, _SOURCE_NAME)

    def __getattr__(self, item: str) -> Any:
        if item.startswith("_") or item == "lib":
            raise AttributeError(item)
        return getattr(self.lib, item)


# ---------------------------------------------------------------------------------------------------------------
# compiler identity and keys


@functools.lru_cache(maxsize=None)
def _compiler_identity(cxx: str) -> tuple[str, str]:
    """(resolved path, first line of ``--version``) for ``cxx``; computed once per process per compiler."""
    found = shutil.which(cxx)
    if found is None:
        raise KilnBuildError(f"kiln: C++ compiler {cxx!r} not found (set KILN_CXX or config cxx)")
    path = os.path.realpath(found)
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, errors="replace",
                              timeout=60, env=_compiler_env())
    except (OSError, subprocess.SubprocessError) as e:
        raise KilnBuildError(f"kiln: could not run {path} --version: {e}") from e
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return path, (lines[0].strip() if lines else "")


def _gcc_major(version: str) -> int | None:
    """GCC's major version from its ``--version`` line (``g++ (Debian 12.2.0-14) 12.2.0``), None for others."""
    if "clang" in version.lower() or not re.search(r"g\+\+|gcc|GCC", version):
        return None
    found = re.search(r"\s(\d+)\.\d+\.\d+\s*$", version) or re.search(r"\s(\d+)\.\d+\.\d+", version)
    return int(found.group(1)) if found else None


def workaround_flags(version: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """Flags added to avoid known wrong code of the compiler kiln builds with.

    GCC 12 on x86 with a tuning that turns hardware gathers off (``-march=native`` on AMD Zen) vectorizes an
    indexed load (``buf[r / 4]`` in a lane loop: RMSNorm's per-row scale read per element) as an *emulated*
    gather, new in GCC 12, and together with FMA contraction computed NaN for finite inputs in a two-pass
    reduction kernel (tests/fuzz/found/rms_norm_var_two_simd_passes.py; right at -O1, with
    -ffp-contract=off, with -mtune=generic or with the hardware gathers below).  We ask for hardware gathers,
    which every AVX2 machine has; on Intel tunings they are on already, so the flag changes nothing there."""
    if platform.machine().lower() not in ("x86_64", "amd64") or _gcc_major(version) != 12:
        return ()
    if not any(f.startswith(("-march=", "-mtune=")) for f in flags):
        return ()
    return ("-mtune-ctrl=use_gather_2parts,use_gather_4parts,use_gather",)


def compiler_info(cfg: config.Config | None = None) -> dict[str, Any]:
    """The compiler kiln builds with, for reports: ``{"cxx", "path", "version", "flags"}`` (the flags it is
    invoked with, workarounds included)."""
    cfg = cfg or config.get()
    info: dict[str, Any] = {"cxx": cfg.cxx, "path": None, "version": None, "flags": list(cfg.cxx_flags)}
    try:
        info["path"], info["version"] = _compiler_identity(cfg.cxx)
        info["flags"] += list(workaround_flags(info["version"], tuple(cfg.cxx_flags)))
    except KilnBuildError as e:
        info["error"] = str(e)
    return info


def _kiln_version() -> str:
    from kiln.version import __version__
    return __version__


def _cache_key(source: str, compiler: tuple[str, str], flags: tuple[str, ...]) -> str:
    payload = json.dumps({
        "format": FORMAT_VERSION,
        "kiln": _kiln_version(),
        "compiler_path": compiler[0],
        "compiler_version": compiler[1],
        "flags": list(flags),
        "source": source,
    }, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _compiler_env() -> dict[str, str]:
    env = dict(os.environ)
    env["LC_ALL"] = "C"  # plain-ASCII diagnostics, stable across machines
    return env


# ---------------------------------------------------------------------------------------------------------------
# in-process state

_memo: dict[tuple[str, str], CompiledModule] = {}
_memo_lock = threading.Lock()
# abspath -> (st_dev, st_ino) of every file this process dlopen'ed.  dlopen caches by path, so opening a
# rebuilt module.so at a path already opened would hand back the old library; we detect that and load through
# a hard link named after the new inode instead.
_dlopened: dict[str, tuple[int, int]] = {}
_dlopen_lock = threading.Lock()
_swept: set[str] = set()


def clear_memo() -> None:
    """Forget the in-process memo (already-loaded libraries stay loaded: dlopen handles are never closed)."""
    with _memo_lock:
        _memo.clear()


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _dlopen(path: str) -> tuple[ctypes.CDLL, str]:
    path = os.path.abspath(path)
    with _dlopen_lock:
        st = os.stat(path)
        ident = (st.st_dev, st.st_ino)
        load_path = path
        prev = _dlopened.get(path)
        if prev is not None and prev != ident:
            load_path = _alias(path, st)
        lib = ctypes.CDLL(load_path)
        _dlopened[load_path] = ident
        return lib, load_path


def _alias(path: str, st: os.stat_result) -> str:
    """A second name for ``path``'s current inode, in the same entry dir, that this process has not dlopen'ed."""
    base, ext = os.path.splitext(path)
    alias = f"{base}.{st.st_ino}{ext}"
    ident = (st.st_dev, st.st_ino)
    if _dlopened.get(alias) not in (None, ident):
        # Cannot happen while the old inode is mapped (inode numbers are not reused); be safe anyway.
        alias = f"{base}.{st.st_ino}.{os.getpid()}.{time.monotonic_ns()}{ext}"
    try:
        ast = os.stat(alias)
        if (ast.st_dev, ast.st_ino) == ident:
            return alias
        os.unlink(alias)
    except FileNotFoundError:
        pass
    tmp = f"{alias}.{os.getpid()}.tmp"
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copy2(path, tmp)  # filesystem without hard links; content was verified, copy is equivalent
    os.replace(tmp, alias)
    return alias


# ---------------------------------------------------------------------------------------------------------------
# cache entries


class _Invalid(Exception):
    """The entry exists but must not be used."""


def _read_valid_meta(entry: Path, key: str) -> dict:
    """meta.json of a complete, uncorrupted entry, else raise _Invalid (FileNotFoundError if there is no entry)."""
    if not entry.is_dir():
        raise FileNotFoundError(str(entry))
    try:
        meta = json.loads((entry / _META_NAME).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise _Invalid(f"meta.json unreadable: {e}") from None
    if not isinstance(meta, dict) or meta.get("key") != key or meta.get("format") != FORMAT_VERSION:
        raise _Invalid("meta.json does not describe this key/format")
    so = entry / _SO_NAME
    try:
        size = so.stat().st_size
    except OSError as e:
        raise _Invalid(f"{_SO_NAME} missing: {e}") from None
    if size != meta.get("so_size"):
        raise _Invalid(f"{_SO_NAME} size {size} != recorded {meta.get('so_size')}")
    if _sha256_file(str(so)) != meta.get("so_sha256"):
        raise _Invalid(f"{_SO_NAME} sha256 mismatch")
    return meta


def _try_load(entry: Path, key: str, name: str) -> CompiledModule:
    """Load a verified entry; FileNotFoundError if absent, _Invalid if it must be discarded."""
    meta = _read_valid_meta(entry, key)
    try:
        lib, load_path = _dlopen(str(entry / _SO_NAME))
    except OSError as e:
        if not entry.is_dir():  # moved aside by another process between verification and dlopen
            raise FileNotFoundError(str(entry)) from None
        raise _Invalid(f"dlopen failed: {e}") from None
    return CompiledModule(lib=lib, path=str(entry / _SO_NAME), key=key, from_cache=True, compile_seconds=0.0,
                          name=name, load_path=load_path, meta=meta)


def _discard(cache: Path, entry: Path, *, count: bool = True) -> None:
    """Move an entry aside (atomically, so nobody sees it half-deleted), then delete it."""
    trash = cache / "trash"
    trash.mkdir(parents=True, exist_ok=True)
    dest = trash / f"{entry.name}.{os.getpid()}.{time.monotonic_ns()}"
    try:
        os.rename(entry, dest)
    except FileNotFoundError:
        return
    if count:
        build_stats.rebuilds += 1
    shutil.rmtree(dest, ignore_errors=True)


def _sweep(cache: Path) -> None:
    """Once per process and cache dir: remove abandoned build dirs and leftover trash."""
    if str(cache) in _swept:
        return
    _swept.add(str(cache))
    now = time.time()
    for sub, max_age in (("tmp", STALE_TMP_S), ("trash", 60.0)):
        d = cache / sub
        if not d.is_dir():
            continue
        for child in d.iterdir():
            try:
                if now - child.lstat().st_mtime > max_age:
                    shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
            except OSError:
                pass


class _FileLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> "_FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


def _compile(cache: Path, key: str, source: str, compiler: tuple[str, str], flags: tuple[str, ...],
             name: str) -> tuple[Path, float]:
    """Build into a private dir under <cache>/tmp; return (that dir, seconds). Raises KilnBuildError."""
    tmp_root = cache / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(prefix=f"{key[:16]}-{os.getpid()}-", dir=tmp_root))
    src = build_dir / _SOURCE_NAME
    src.write_text(source)
    so = build_dir / _SO_NAME
    # Relative names (cwd is the build dir) so diagnostics read "source.cpp:LINE:COL", not a temp path.
    cmd = [compiler[0], *flags, "-o", _SO_NAME, _SOURCE_NAME, *_LINK_FLAGS]
    build_stats.compiles += 1
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=COMPILE_TIMEOUT_S,
                              env=_compiler_env(), cwd=build_dir)
        returncode, output = proc.returncode, (proc.stderr or proc.stdout or "")
    except subprocess.TimeoutExpired as e:
        returncode, output = None, f"timed out after {COMPILE_TIMEOUT_S}s\n{e.stderr or ''}"
    except OSError as e:
        returncode, output = None, f"could not run the compiler: {e}"
    seconds = time.perf_counter() - t0
    build_stats.compile_seconds += seconds
    if returncode != 0 or not so.is_file():
        build_stats.failures += 1
        kept = _keep_failure(cache, key, build_dir, output)
        lines = output.splitlines()
        shown = "\n".join(lines[:ERROR_LINES])
        if len(lines) > ERROR_LINES:
            full_log = os.path.join(os.path.dirname(kept), "stderr.txt")
            shown += f"\n... ({len(lines) - ERROR_LINES} more lines in {full_log})"
        raise KilnBuildError(
            f"kiln: compiling module {name!r} failed (exit status {returncode})\n"
            f"command: {shlex.join(cmd)}\n"
            f"source kept at: {kept}\n"
            f"compiler output:\n{shown}",
            cmd=cmd, returncode=returncode, stderr=output, source_path=kept)
    data = so.read_bytes()
    meta = {
        "format": FORMAT_VERSION,
        "key": key,
        "name": name,
        "so_sha256": hashlib.sha256(data).hexdigest(),
        "so_size": len(data),
        "source_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
        "compiler": {"path": compiler[0], "version": compiler[1]},
        "flags": list(flags),
        "link_flags": list(_LINK_FLAGS),
        "kiln_version": _kiln_version(),
        "compile_seconds": round(seconds, 4),
        "created": time.time(),
        "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (build_dir / _META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.chmod(build_dir, 0o755)  # mkdtemp makes it 0700; the published entry should be readable like the rest
    return build_dir, seconds


def _keep_failure(cache: Path, key: str, build_dir: Path, output: str) -> str:
    """Move a failed build dir to <cache>/failed/<key> (with stderr.txt); return the kept source path."""
    try:
        (build_dir / "stderr.txt").write_text(output)
        failed = cache / "failed"
        failed.mkdir(parents=True, exist_ok=True)
        dest = failed / key
        if dest.exists():
            _discard(cache, dest, count=False)
        os.rename(build_dir, dest)
        return str(dest / _SOURCE_NAME)
    except OSError:
        return str(build_dir / _SOURCE_NAME)


def _publish(build_dir: Path, entry: Path) -> bool:
    """Atomically rename the finished build dir into place; False if an entry is already there."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(build_dir, entry)
        return True
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            shutil.rmtree(build_dir, ignore_errors=True)
            return False
        shutil.rmtree(build_dir, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------------------------
# entry point


def load_module(source: str, *, name: str = "kiln_module", cfg: config.Config | None = None,
                extra_flags: tuple[str, ...] = ()) -> CompiledModule:
    """Compile ``source`` (C++) into a shared library, or reuse the cached build, and load it with ctypes.

    Loads at most once per process (memo), compiles at most once per key across processes (per-key flock), and
    never loads a corrupt or half-written cache entry (it is moved aside and rebuilt). Raises
    :class:`KilnBuildError` when the compiler fails.
    """
    cache, key, compiler, flags = _where(source, cfg or config.get(), extra_flags)
    module = _loaded_or_cached(cache, key, name)
    if module is None:
        with _FileLock(cache / "locks" / f"{key}.lock"):
            module = _load_or_build_locked(cache, cache / key[:2] / key, key, source, compiler, flags, name)
    with _memo_lock:
        return _memo.setdefault((str(cache), key), module)


def _where(source: str, cfg: config.Config, extra_flags: tuple[str, ...]
           ) -> tuple[Path, str, tuple[str, str], tuple[str, ...]]:
    """(cache directory, cache key, compiler identity, flags) of ``source`` under ``cfg``."""
    compiler = _compiler_identity(cfg.cxx)
    flags = tuple(cfg.cxx_flags) + tuple(extra_flags)
    flags += workaround_flags(compiler[1], flags)
    return Path(os.path.abspath(os.path.expanduser(cfg.cache_dir))), _cache_key(source, compiler, flags), compiler, \
        flags


def _loaded_or_cached(cache: Path, key: str, name: str) -> CompiledModule | None:
    """The module loaded in this process, or a complete entry of the disk cache (loaded now; no lock needed to
    read one); None when it would have to be built."""
    with _memo_lock:
        hit = _memo.get((str(cache), key))
    if hit is not None:
        build_stats.memo_hits += 1
        return hit
    try:
        module = _try_load(cache / key[:2] / key, key, name)
    except (FileNotFoundError, _Invalid):
        return None
    build_stats.cache_hits += 1
    with _memo_lock:
        return _memo.setdefault((str(cache), key), module)


def _load_or_build_locked(cache: Path, entry: Path, key: str, source: str, compiler: tuple[str, str],
                          flags: tuple[str, ...], name: str) -> CompiledModule:
    # Someone may have built it while we waited for the lock.
    try:
        module = _try_load(entry, key, name)
        build_stats.cache_hits += 1
        return module
    except FileNotFoundError:
        pass
    except _Invalid:
        _discard(cache, entry)

    _sweep(cache)
    for _attempt in range(2):
        build_dir, seconds = _compile(cache, key, source, compiler, flags, name)
        if not _publish(build_dir, entry):
            # Published by a process that did not take the lock (or a lock that does not work on this
            # filesystem): use theirs if it is good, otherwise clear it and build again.
            try:
                module = _try_load(entry, key, name)
                build_stats.cache_hits += 1
                return module
            except FileNotFoundError:
                continue
            except _Invalid:
                _discard(cache, entry)
                continue
        try:
            module = _try_load(entry, key, name)
        except FileNotFoundError:
            continue  # moved aside by someone else right after publishing; build again
        except _Invalid as e:
            # Deterministic (e.g. an undefined symbol at dlopen): keep it out of the cache, keep it for humans.
            kept = _keep_failure(cache, key, entry, str(e))
            build_stats.failures += 1
            raise KilnBuildError(f"kiln: module {name!r} compiled but cannot be loaded: {e}\n"
                                 f"source kept at: {kept}", stderr=str(e), source_path=kept) from None
        module.from_cache = False
        module.compile_seconds = seconds
        return module
    raise KilnBuildError(f"kiln: could not publish module {name!r} to {entry} (concurrent removal?)")


def builds(load: Any) -> bool:
    """Does ``load()`` (which builds and loads one of kiln's hand-scheduled libraries) succeed here?  False on
    machines without the vector ISA the library needs or without a working compiler: callers keep the library
    kiln would otherwise replace."""
    try:
        load()
        return True
    except Exception:  # noqa: BLE001 - any build or load failure means "not here"
        return False


_background: dict[tuple[str, str], Any] = {}  # (cache dir, library) -> the Future of its build, once per process
_background_lock = threading.Lock()


def start_builds(loads: dict[str, Any]) -> None:
    """Start ``builds(load)`` for each of kiln's libraries (by name) in background threads and return at once: g++
    runs in its own process, so several libraries build in parallel, and a later ``available()`` waits only for
    what is not yet built (the module cache's file lock makes it wait for the background build, not start
    another)."""
    from concurrent.futures import ThreadPoolExecutor
    cache = config.get().cache_dir
    with _background_lock:
        for name, load in loads.items():
            if (cache, name) not in _background:
                pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kiln-build-{name}")
                _background[(cache, name)] = pool.submit(builds, load)
                pool.shutdown(wait=False)

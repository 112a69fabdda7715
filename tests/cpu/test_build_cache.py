"""On-disk build cache of kiln.runtime.build: hits, cross-process reuse, corruption, concurrency, errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kiln import config
from kiln.runtime import build
from kiln.runtime.build import KilnBuildError, build_stats, load_module

REPO = Path(__file__).resolve().parents[2]


def _src(tag: str, body: str = "return a + b;") -> str:
    # A unique comment makes every test's module (and cache key) its own.
    return f'// {tag}\nextern "C" int add(int a, int b) {{ {body} }}\n'


@pytest.fixture
def cache(tmp_path):
    build.clear_memo()
    build_stats.reset()
    with config.scope(cache_dir=str(tmp_path)):
        yield tmp_path
    build.clear_memo()


def _entry(cache_dir: Path, mod) -> Path:
    entry = Path(mod.path).parent
    assert entry.parent.parent == cache_dir
    return entry


def _run_child(cache_dir: Path, source: str, extra: str = "", **popen) -> subprocess.Popen:
    code = "\n".join([
        "import json, os, sys, time",
        textwrap.dedent(extra),
        "from kiln.runtime.build import load_module, build_stats",
        f"m = load_module({source!r})",
        'print(json.dumps({"stats": build_stats.as_dict(), "from_cache": m.from_cache, "value": m.add(2, 3)}))',
    ])
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _child_result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _build_in_child(cache_dir: Path, source: str) -> dict:
    """Populate the cache without dlopen'ing the module in this process (so we may corrupt it in place)."""
    result = _child_result(_run_child(cache_dir, source))
    assert result["stats"]["compiles"] == 1
    return result


def test_build_then_cache_hit(cache):
    src = _src("hit")
    m1 = load_module(src)
    assert not m1.from_cache and m1.compile_seconds > 0
    assert build_stats.compiles == 1
    assert m1.lib.add(2, 3) == 5 and m1.add(40, 2) == 42

    entry = _entry(cache, m1)
    assert sorted(p.name for p in entry.iterdir()) == ["meta.json", "module.so", "source.cpp"]
    assert (entry / "source.cpp").read_text() == src
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["key"] == m1.key and entry.name == m1.key and entry.parent.name == m1.key[:2]
    assert meta["so_size"] == (entry / "module.so").stat().st_size
    assert "-lm" in meta["link_flags"] and meta["flags"] == build.compiler_info()["flags"]

    # Same process: in-process memo.
    assert load_module(src) is m1
    assert build_stats.memo_hits == 1

    # Memo cleared: the disk cache answers, no compiler.
    build.clear_memo()
    m2 = load_module(src)
    assert m2.from_cache and m2.compile_seconds == 0.0 and m2.key == m1.key
    assert build_stats.compiles == 1 and build_stats.cache_hits == 1
    assert m2.add(-1, 1) == 0


def test_key_depends_on_flags_and_source(cache):
    base = load_module(_src("keys"))
    assert load_module(_src("keys"), extra_flags=("-DKILN_TEST=1",)).key != base.key
    assert load_module(_src("keys", "return a - b;")).key != base.key
    assert build_stats.compiles == 3


def test_new_process_compiles_nothing(cache):
    src = _src("new-process")
    load_module(src)
    assert build_stats.compiles == 1
    result = _child_result(_run_child(cache, src))
    assert result["value"] == 5 and result["from_cache"]
    assert result["stats"]["compiles"] == 0 and result["stats"]["cache_hits"] == 1


@pytest.mark.parametrize("how", ["truncate", "flip_bytes"])
def test_corrupt_so_is_rebuilt(cache, how):
    src = _src(f"corrupt-{how}")
    _build_in_child(cache, src)
    (so,) = cache.glob("??/*/module.so")
    data = so.read_bytes()
    if how == "truncate":
        with open(so, "r+b") as f:
            f.truncate(len(data) // 2)
    else:
        with open(so, "r+b") as f:
            f.seek(len(data) // 2)
            f.write(bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 64]))
    m = load_module(src)
    assert not m.from_cache
    assert build_stats.compiles == 1 and build_stats.rebuilds == 1
    assert m.add(2, 3) == 5
    # The rebuilt entry is good again: another process uses it.
    assert _child_result(_run_child(cache, src))["stats"]["compiles"] == 0


@pytest.mark.parametrize("garble", ["not json {", "", '{"key": "something else"}', None])
def test_bad_meta_is_rebuilt(cache, garble):
    src = _src(f"meta-{garble!r}")
    m1 = load_module(src)  # dlopen'ed in this process: the rebuild must not get the stale handle back
    meta = _entry(cache, m1) / "meta.json"
    if garble is None:
        meta.unlink()
    else:
        meta.write_text(garble)
    build.clear_memo()
    m2 = load_module(src)
    assert not m2.from_cache and build_stats.compiles == 2 and build_stats.rebuilds == 1
    assert m2.path == m1.path
    assert m2.lib._handle != m1.lib._handle  # a fresh library, not dlopen's cached handle for the same path
    assert m2.add(2, 3) == 5
    assert json.loads(meta.read_text())["key"] == m2.key


def test_hash_mismatch_same_size_is_rebuilt(cache):
    src = _src("same-size")
    m1 = load_module(src)
    so = Path(m1.path)
    data = bytearray(so.read_bytes())
    data[-1] ^= 0xFF
    so.unlink()  # replace the file rather than writing into the copy this process has mapped
    so.write_bytes(bytes(data))
    build.clear_memo()
    m2 = load_module(src)
    assert not m2.from_cache and build_stats.rebuilds == 1 and m2.add(1, 1) == 2


def test_leftovers_do_not_break_anything(cache):
    # Half-written private build dirs, one old enough to be swept, one fresh (maybe someone's live build).
    old = cache / "tmp" / "0123456789abcdef-99999-old"
    fresh = cache / "tmp" / "0123456789abcdef-99998-fresh"
    for d in (old, fresh):
        d.mkdir(parents=True)
        (d / "module.so").write_bytes(b"\x7fELF garbage")
        (d / "source.cpp").write_text("int broken(")
    ancient = time.time() - build.STALE_TMP_S - 10
    os.utime(old, (ancient, ancient))
    # Trash left by a process killed while deleting.
    (cache / "trash" / "x").mkdir(parents=True)

    src = _src("leftovers")
    m = load_module(src)
    assert m.add(2, 3) == 5 and build_stats.compiles == 1
    assert not old.exists() and fresh.exists()
    assert sorted(p.name for p in (cache / "tmp").iterdir()) == [fresh.name]

    # A half-written entry from a crashed non-atomic writer: no meta.json, truncated .so.
    entry = _entry(cache, m)
    for p in entry.iterdir():
        p.unlink()
    (entry / "module.so").write_bytes(b"\x7fELF")
    build.clear_memo()
    m2 = load_module(src)
    assert not m2.from_cache and m2.add(2, 3) == 5
    assert build_stats.compiles == 2 and build_stats.rebuilds == 1


def test_concurrent_processes_compile_once(cache):
    src = _src("concurrent")
    go = cache / "go"
    # Each child signals it is ready, then spins until the parent says go, so both hit the cache together.
    extra = textwrap.dedent(f"""
        open({str(cache)!r} + "/ready-" + str(os.getpid()), "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
    """)
    procs = [_run_child(cache, src, extra) for _ in range(2)]
    deadline = time.time() + 30
    while len(list(cache.glob("ready-*"))) < len(procs):
        assert time.time() < deadline and all(p.poll() is None for p in procs), "children did not start"
        time.sleep(0.01)
    go.touch()
    results = [_child_result(p) for p in procs]
    assert all(r["value"] == 5 for r in results)
    assert sum(r["stats"]["compiles"] for r in results) == 1
    assert sorted(r["from_cache"] for r in results) == [False, True]
    assert len(list(cache.glob("??/*/module.so"))) == 1
    assert list((cache / "tmp").iterdir()) == []


def test_syntax_error_raises_build_error(cache):
    src = 'extern "C" int add(int a, int b) { return a + ; }\n'
    with pytest.raises(KilnBuildError) as info:
        load_module(src, name="broken")
    err = info.value
    assert isinstance(err, RuntimeError)
    msg = str(err)
    assert "error" in msg and "expected" in msg  # the compiler's own diagnostic
    assert "g++" in msg and "-shared" in msg and "-lm" in msg  # the command
    assert err.source_path and err.source_path in msg
    assert Path(err.source_path).read_text() == src
    assert build_stats.compiles == 1 and build_stats.failures == 1
    # Nothing was published; a fixed source builds fine afterwards.
    assert list(cache.glob("??/*")) == []
    assert load_module(_src("fixed")).add(1, 2) == 3


def test_error_message_is_capped(cache):
    src = "\n".join(f"int f{i}() {{ return undeclared_{i}; }}" for i in range(200))
    with pytest.raises(KilnBuildError) as info:
        load_module(src)
    msg = str(info.value)
    assert "undeclared_0" in msg and "undeclared_199" not in msg and "more lines in" in msg
    assert "undeclared_199" in info.value.stderr


def test_compiler_info():
    info = build.compiler_info()
    assert info["path"] and os.path.isabs(info["path"])
    assert info["version"]
    missing = build.compiler_info(config.get().with_options(cxx="kiln-no-such-compiler"))
    assert missing["path"] is None and "not found" in missing["error"]


def test_gcc12_emulated_gather_workaround_flags(monkeypatch):
    """GCC 12 on x86 gets hardware gathers (its emulated ones miscompiled a kernel); others get nothing."""
    from kiln.runtime import build
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    native = ("-O3", "-march=native")
    gcc12 = "x86_64-linux-gnu-g++-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
    assert build.workaround_flags(gcc12, native) == ("-mtune-ctrl=use_gather_2parts,use_gather_4parts,use_gather",)
    assert build.workaround_flags(gcc12, ("-O3",)) == ()
    assert build.workaround_flags("g++ (GCC) 13.2.1 20230801", native) == ()
    assert build.workaround_flags("Ubuntu clang version 15.0.7", native) == ()
    monkeypatch.setattr(build.platform, "machine", lambda: "aarch64")
    assert build.workaround_flags(gcc12, native) == ()

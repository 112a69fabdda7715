"""The tuning database: records, WAL, damaged files set aside, concurrent writers, the ``kiln db`` command."""
import json
import multiprocessing
import sqlite3
import subprocess
import sys

import pytest

from kiln.cli import main as cli_main
from kiln.tune.db import TuningDB


def _db(tmp_path, **kw):
    return TuningDB(tmp_path / "tuning.sqlite", hardware=kw.get("hardware", "cpuA"), versions=kw.get("versions", "v1"))


def test_put_get_keeps_the_faster_record(tmp_path):
    db = _db(tmp_path)
    assert db.put("gemm:2048", "gemm", {"tile": [8, 32]}, 0.050, 0.001, structure="gemm:f32")
    assert not db.put("gemm:2048", "gemm", {"tile": [4, 16]}, 0.070, 0.001, structure="gemm:f32")
    assert db.put("gemm:2048", "gemm", {"tile": [6, 64]}, 0.040, 0.002, structure="gemm:f32")
    r = db.get("gemm:2048")
    assert r.trace == {"tile": [6, 64]} and r.median_s == 0.040 and r.spread_s == 0.002
    assert db.get("missing") is None
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_records_are_per_machine_and_versions_and_seed_nearby_shapes(tmp_path):
    db = _db(tmp_path)
    db.put("gemm:1024", "gemm", {"t": 1}, 0.010, 0.0, structure="gemm:f32")
    db.put("gemm:4096", "gemm", {"t": 2}, 0.500, 0.0, structure="gemm:f32")
    db.put("conv:1", "conv", {"t": 3}, 0.020, 0.0, structure="conv:f32")
    other = TuningDB(db.path, hardware="cpuB", versions="v1")
    assert other.get("gemm:1024") is None
    assert [r.key for r in db.nearby("gemm:f32")] == ["gemm:1024", "gemm:4096"]
    assert len(other.records(everything=True)) == 3 and other.records() == []
    assert other.prune(other_machines=True) == 3 and db.records() == []


def test_damaged_file_is_set_aside_and_replaced(tmp_path):
    path = tmp_path / "tuning.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.warns(UserWarning, match="damaged"):
        db = TuningDB(path, hardware="h", versions="v")
    assert db.put("k", "pointwise", {"x": 1}, 1.0, 0.0)
    assert db.get("k").trace == {"x": 1}
    assert list(tmp_path.glob("tuning.sqlite.corrupt-*"))


def _writer(path: str, worker: int, count: int) -> None:
    db = TuningDB(path, hardware="h", versions="v")
    for i in range(count):
        db.put(f"w{worker}:k{i}", "gemm", {"i": i}, 0.001 * (i + 1), 0.0)
    db.close()


def test_concurrent_writers_lose_no_record(tmp_path):
    path = str(tmp_path / "tuning.sqlite")
    TuningDB(path, hardware="h", versions="v").close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert len(TuningDB(path, hardware="h", versions="v").records()) == 200


def test_cli_list_show_export_import_prune(tmp_path, capsys):
    db = _db(tmp_path, hardware=None, versions=None)  # this machine: what the command sees
    db.put("gemm:512", "gemm", {"tile": [4, 4]}, 0.002, 0.0001, structure="gemm:f32")
    db.close()
    path = str(tmp_path / "tuning.sqlite")
    assert cli_main(["db", "--path", path, "list"]) == 0
    assert "gemm:512" in capsys.readouterr().out
    assert cli_main(["db", "--path", path, "show", "gemm:512"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"] == {"tile": [4, 4]}
    out = tmp_path / "export.json"
    assert cli_main(["db", "--path", path, "export", str(out)]) == 0
    fresh = str(tmp_path / "fresh.sqlite")
    assert cli_main(["db", "--path", fresh, "import", str(out)]) == 0
    assert "imported 1" in capsys.readouterr().out
    assert cli_main(["db", "--path", fresh, "prune", "--older-than-days", "0"]) == 0
    assert "pruned 1" in capsys.readouterr().out


def test_prune_retired_kinds_keeps_what_kiln_reads(tmp_path, capsys):
    """A tuner that changed its kernel or timing stores under a new kind; the old kind's records are never read
    again, and ``prune --retired`` drops them (and only them)."""
    from kiln.tune import cpu_pointwise, live_kinds
    from kiln.library.gemm import tune as cpu_gemm
    db = _db(tmp_path, hardware=None, versions=None)
    db.put("cpu_gemm2:f32:64x64x64:t1", "cpu_gemm2", {"kc": 64}, 0.001, 0.0, structure="cpu_gemm2")
    db.put("cpu_gemm2:f32:64x64x64:t1:6/64/66", "cpu_gemm2_sample", {"kc": 64}, 0.001, 0.0)
    db.put(f"{cpu_gemm.KIND}:f32:64x64x64:t1", cpu_gemm.KIND, {"kc": 64}, 0.001, 0.0, structure=cpu_gemm.KIND)
    db.put("k|loops", cpu_pointwise.SAMPLE_KIND, {"loops": ""}, 0.001, 0.0)
    db.put("cpp:pointwise:abc", "pointwise", {"loops": ""}, 0.001, 0.0)
    db.close()
    assert {"pointwise", "reduction", "gpu-matmul", cpu_gemm.KIND, cpu_gemm.SAMPLE_KIND} <= set(live_kinds())
    path = str(tmp_path / "tuning.sqlite")
    assert cli_main(["db", "--path", path, "prune", "--retired"]) == 0
    assert "pruned 2" in capsys.readouterr().out
    db = _db(tmp_path, hardware=None, versions=None)
    assert sorted(r.kind for r in db.records()) == sorted([cpu_gemm.KIND, cpu_pointwise.SAMPLE_KIND, "pointwise"])
    db.close()


def test_python_dash_m_kiln_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kiln", "db", "--path", str(tmp_path / "t.sqlite"), "list"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "0 record(s)" in proc.stdout


def test_sqlite_file_is_a_real_database(tmp_path):
    db = _db(tmp_path)
    db.put("k", "kind", [1, 2], 0.5, 0.1)
    db.close()
    with sqlite3.connect(tmp_path / "tuning.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM records").fetchone()[0] == 1

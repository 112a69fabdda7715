"""The tuning database: measured schedules per kernel, kept across processes in SQLite.

A record is keyed by a canonical kernel description (its structure and shapes), the hardware it was measured
on and the software versions that generated and ran it; it keeps the schedule trace (JSON), the median time
and its spread.  Records of the same *structure* at other shapes seed the search for a new shape.

Concurrency and damage:
- the file runs in WAL mode with a busy timeout, so several tuning processes write without losing records;
- a file that is not a database, or fails SQLite's quick check, is set aside (renamed ``*.corrupt-<time>``),
  the user is told with a warning, and an empty database takes its place.

    db = TuningDB.open()                       # <cache_dir>/tuning.sqlite
    db.put("gemm:f32:2048x2048x2048", "gemm", {"tile": [8, 32]}, median_s=0.041, spread_s=0.0004,
           structure="gemm:f32")
    db.get("gemm:f32:2048x2048x2048")          # -> Record | None (this machine, these versions)
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import sqlite3
import subprocess
import time
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

from kiln import config

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    key TEXT NOT NULL,
    hardware TEXT NOT NULL,
    versions TEXT NOT NULL,
    kind TEXT NOT NULL,
    structure TEXT NOT NULL,
    trace TEXT NOT NULL,
    median_s REAL NOT NULL,
    spread_s REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (key, hardware, versions)
);
CREATE INDEX IF NOT EXISTS by_structure ON records (structure, hardware, versions);
"""
COLUMNS = ("key", "hardware", "versions", "kind", "structure", "trace", "median_s", "spread_s", "created")


@dataclasses.dataclass(frozen=True)
class Record:
    key: str
    hardware: str
    versions: str
    kind: str
    structure: str
    trace: Any          # the schedule, as JSON data
    median_s: float
    spread_s: float
    created: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@lru_cache(maxsize=None)
def cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    """The CPU's model name and feature flags (Linux ``/proc/cpuinfo``; elsewhere the platform's name, no flags)."""
    cpu, flags = platform.processor() or platform.machine(), frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return cpu, flags


@lru_cache(maxsize=None)
def hardware_fingerprint() -> str:
    """CPU model, vector ISA and core count; GPU name and compute capability when CUDA is available."""
    cpu, flags = cpu_model_and_flags()
    isa = "+".join(f for f in ("avx512f", "avx512_bf16", "avx2", "fma", "neon") if f in flags) or "base"
    parts = [cpu, isa, f"{os.cpu_count()} cores"]
    try:
        import torch
        if torch.cuda.is_available():
            cap = torch.cuda.get_device_capability()
            parts.append(f"{torch.cuda.get_device_name()} sm{cap[0]}{cap[1]}")
    except Exception:  # noqa: BLE001 - no torch or no driver: a CPU-only fingerprint
        pass
    return " | ".join(parts)


@lru_cache(maxsize=None)
def software_versions() -> str:
    """kiln, the C++ compiler, torch and triton: a schedule measured under other versions may not hold."""
    from kiln.version import __version__
    parts = [f"kiln {__version__}"]
    try:
        out = subprocess.run([config.get().cxx, "--version"], capture_output=True, text=True, timeout=10)
        parts.append(out.stdout.splitlines()[0] if out.stdout else "cxx ?")
    except (OSError, subprocess.SubprocessError):
        parts.append("cxx ?")
    try:
        import torch
        parts.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    try:
        import triton
        parts.append(f"triton {triton.__version__}")
    except ImportError:
        pass
    return " | ".join(parts)


class TuningDB:
    def __init__(self, path: Path, hardware: str | None = None, versions: str | None = None):
        self.path = Path(path)
        self.hardware = hardware or hardware_fingerprint()
        self.versions = versions or software_versions()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = self._connect()

    @classmethod
    def open(cls, path: str | Path | None = None) -> "TuningDB":
        return cls(Path(path) if path else Path(config.get().cache_dir) / "tuning.sqlite")

    # ------------------------------------------------------------------ opening, damage
    def _connect(self) -> sqlite3.Connection:
        try:
            conn = self._try_connect()
        except sqlite3.DatabaseError as exc:
            self._set_aside(str(exc))
            conn = self._try_connect()
        return conn

    def _try_connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = WAL")
            ok = conn.execute("PRAGMA quick_check").fetchone()
            if not ok or ok[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {ok[0] if ok else 'no answer'}")
            conn.executescript(SCHEMA)
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _set_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            part = Path(str(self.path) + suffix)
            if part.exists():
                os.replace(part, Path(str(aside) + suffix))
        warnings.warn(f"kiln: the tuning database {self.path} was damaged ({why}); it was moved to {aside} and "
                      "an empty one started (schedules will be measured again)", stacklevel=3)

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ records
    def put(self, key: str, kind: str, trace: Any, median_s: float, spread_s: float, structure: str = "") -> bool:
        """Store a measurement; an existing record for the key is replaced only by a faster one.
        Returns whether this record is now the stored one."""
        now = time.time()
        with self._transaction():
            row = self.conn.execute("SELECT median_s FROM records WHERE key=? AND hardware=? AND versions=?",
                                    (key, self.hardware, self.versions)).fetchone()
            if row is not None and row[0] <= median_s:
                return False
            self.conn.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              (key, self.hardware, self.versions, kind, structure or kind,
                               json.dumps(trace, sort_keys=True), float(median_s), float(spread_s), now))
        return True

    def get(self, key: str) -> Record | None:
        row = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM records WHERE key=? AND hardware=? AND versions=?",
                                (key, self.hardware, self.versions)).fetchone()
        return _record(row) if row else None

    def nearby(self, structure: str, limit: int = 8) -> list[Record]:
        """Fastest records of the same structure (other shapes) on this machine: seeds for a new search."""
        rows = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM records WHERE structure=? AND hardware=? "
                                 "AND versions=? ORDER BY median_s LIMIT ?",
                                 (structure, self.hardware, self.versions, limit)).fetchall()
        return [_record(r) for r in rows]

    def records(self, everything: bool = False) -> list[Record]:
        """This machine's and versions' records, or with ``everything`` all of them."""
        sql = f"SELECT {', '.join(COLUMNS)} FROM records"
        args: tuple = ()
        if not everything:
            sql += " WHERE hardware=? AND versions=?"
            args = (self.hardware, self.versions)
        return [_record(r) for r in self.conn.execute(sql + " ORDER BY key", args).fetchall()]

    def prune(self, older_than_s: float | None = None, other_machines: bool = False,
              keep_kinds: Sequence[str] | None = None) -> int:
        """Delete records older than ``older_than_s`` seconds and/or those of other hardware or versions and/or
        (``keep_kinds`` given) those of any other kind: retired kinds that kiln no longer reads (a tuner whose
        kernel or timing changed stores under a new kind, ``cpu_gemm3`` after ``cpu_gemm2``)."""
        clauses, args = [], []
        if keep_kinds is not None:
            clauses.append(f"kind NOT IN ({', '.join('?' * len(keep_kinds))})" if keep_kinds else "1")
            args += list(keep_kinds)
        if older_than_s is not None:
            clauses.append("created < ?")
            args.append(time.time() - older_than_s)
        if other_machines:
            clauses.append("(hardware != ? OR versions != ?)")
            args += [self.hardware, self.versions]
        if not clauses:
            return 0
        with self._transaction():
            cur = self.conn.execute("DELETE FROM records WHERE " + " OR ".join(clauses), args)
        return cur.rowcount

    def export_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.records(everything=True)]

    def import_json(self, items: list[dict[str, Any]]) -> int:
        """Add records (each kept only if faster than what is stored for its key, hardware and versions)."""
        count = 0
        with self._transaction():
            for it in items:
                row = self.conn.execute("SELECT median_s FROM records WHERE key=? AND hardware=? AND versions=?",
                                        (it["key"], it["hardware"], it["versions"])).fetchone()
                if row is not None and row[0] <= it["median_s"]:
                    continue
                self.conn.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                  (it["key"], it["hardware"], it["versions"], it["kind"], it["structure"],
                                   json.dumps(it["trace"], sort_keys=True), float(it["median_s"]),
                                   float(it["spread_s"]), float(it["created"])))
                count += 1
        return count

    def _transaction(self) -> Any:
        return _Transaction(self.conn)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT: takes the write lock up front, so read-then-write is atomic."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _record(row: tuple) -> Record:
    values = dict(zip(COLUMNS, row))
    values["trace"] = json.loads(values["trace"])
    return Record(**values)


def iter_lines(records: list[Record]) -> Iterator[str]:
    """One line per record, for ``kiln db list``."""
    for r in records:
        yield f"{r.key:<48} {r.kind:<10} {r.median_s * 1e6:10.1f} us  +-{r.spread_s * 1e6:.1f}  {r.hardware[:40]}"

"""Small measured decisions kept as JSON beside the module cache (GEMM library per shape, layout per graph).

Writes are atomic (temporary file + rename), so concurrent processes never read half a file; a missing or
damaged file reads as empty (the decision is measured again), and a read-only cache only costs that.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kiln import config


def store_path(name: str) -> Path:
    return Path(config.get().cache_dir) / name


def load(name: str) -> dict[str, Any]:
    try:
        data = json.loads(store_path(name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(name: str, data: dict[str, Any]) -> None:
    path = store_path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass

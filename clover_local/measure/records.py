"""Decode speeds measured on this machine, kept in ``$CLOVER_DATA_DIR/speed-records.json`` for the planner.

``clover-local bench --llama-bench`` appends a record per run; planning reads them back
(:func:`clover_local.plan.measured.apply_measurements` decides what they mean for a plan).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path

from clover_local import settings
from clover_local.plan.measured import SpeedRecord

_MAX_RECORDS = 200


def records_path() -> Path:
    return settings.data_dir() / "speed-records.json"


def load_records(path: Path | None = None) -> list[SpeedRecord]:
    """Every usable record (a damaged or foreign file gives none, never an error: they are only hints)."""
    path = path or records_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    names = {f.name for f in fields(SpeedRecord)}
    out: list[SpeedRecord] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not names >= set(item):
            continue
        try:
            out.append(SpeedRecord(**item))
        except TypeError:
            continue
    return out


def add_record(record: SpeedRecord, path: Path | None = None) -> Path:
    """Append ``record`` (oldest dropped past a limit), written atomically."""
    path = path or records_path()
    kept = [asdict(r) for r in load_records(path)][-(_MAX_RECORDS - 1) :]
    kept.append(asdict(record))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path

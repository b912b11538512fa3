"""Decode speeds measured on this machine, kept in ``$CLOVER_DATA_DIR/speed-records.json`` for the planner, and
the speculation modes ``bench --spec-modes`` compared (``speculation-bench.json``), for ``--spec auto``.

``clover-local bench --llama-bench`` appends a record per run; planning reads them back
(:func:`clover_local.plan.measured.apply_measurements` decides what they mean for a plan).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, fields
from pathlib import Path

from clover_local import settings
from clover_local.plan.measured import SpeedRecord, VerifyCostRecord
from clover_local.user_files import write_atomically

_MAX_RECORDS = 200


def _read_json(path: Path) -> object:
    """The JSON in ``path``; None when it is missing or damaged (a bad file must never stop planning)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: object, *, indent: int) -> Path:
    write_atomically(path, (json.dumps(data, indent=indent) + "\n").encode())
    return path


def records_path() -> Path:
    return settings.data_dir() / "speed-records.json"


def load_records(path: Path | None = None) -> list[SpeedRecord]:
    """Every usable record (a damaged or foreign file gives none, never an error: they are only hints)."""
    raw = _read_json(path or records_path())
    names = {f.name for f in fields(SpeedRecord)}
    out: list[SpeedRecord] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not names >= set(item):
            continue
        with contextlib.suppress(TypeError):
            out.append(SpeedRecord(**item))
    return out


def add_record(record: SpeedRecord, path: Path | None = None) -> Path:
    """Append ``record`` (oldest dropped past a limit), written atomically."""
    path = path or records_path()
    kept = [asdict(r) for r in load_records(path)][-(_MAX_RECORDS - 1) :]
    kept.append(asdict(record))
    return _write_json(path, kept, indent=1)


# -- speculation modes (``bench --spec-modes``) -------------------------------------------------------------


def spec_records_path() -> Path:
    return settings.data_dir() / "speculation-bench.json"


def spec_model_key(model: str) -> str:
    """``/x/y/Model-Q4_K_M.gguf`` -> ``Model-Q4_K_M.gguf`` (the same quant file on another path is the same
    model); ``preset:quant`` (before download) unchanged."""
    return Path(model).name if model.endswith(".gguf") else model


def load_spec_ratios(model: str, path: Path | None = None) -> dict[str, float]:
    """Speculation mode -> decode speed ratio over plain decoding, as ``bench --spec-modes`` measured it for
    ``model`` here; empty when never measured (or the file is unreadable: a bad file must never stop planning)."""
    return load_all_spec_ratios(path).get(spec_model_key(model), {})


def load_all_spec_ratios(path: Path | None = None) -> dict[str, dict[str, float]]:
    """Every model's ratios (:func:`load_spec_ratios`), keyed as :func:`spec_model_key` keys them; a damaged
    entry is left out, a damaged file gives none."""
    data = _read_json(path or spec_records_path())
    out: dict[str, dict[str, float]] = {}
    for key, entry in data.items() if isinstance(data, dict) else ():
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            out[str(key)] = {str(m): float(r) for m, r in entry["ratios"].items()}
    return out


def save_spec_ratios(model: str, ratios: dict[str, float], engine: str, path: Path | None = None) -> Path:
    """Remember ``ratios`` (mode -> ratio over plain) for ``model``, replacing earlier ones; written atomically."""
    import time

    path = path or spec_records_path()
    data = _read_json(path)
    if not isinstance(data, dict):
        data = {}
    data[spec_model_key(model)] = {"ratios": dict(ratios), "engine": engine, "measured_at": time.time()}
    return _write_json(path, data, indent=2)


# -- verification costs (the embedded engine measures them at first load) ------------------------------------


def verify_costs_path() -> Path:
    return settings.data_dir() / "verify-costs.json"


def load_verify_costs(path: Path | None = None) -> list[VerifyCostRecord]:
    """Every usable verification cost table (a damaged file gives none: the plan then uses its model)."""
    raw = _read_json(path or verify_costs_path())
    out: list[VerifyCostRecord] = []
    for item in raw if isinstance(raw, list) else []:
        with contextlib.suppress(TypeError, KeyError, ValueError):
            record = VerifyCostRecord(  # a list or a string raises TypeError at item["key"]
                str(item["key"]),
                tuple(float(c) for c in item["costs"]),
                float(item["step_ms"]),
                str(item.get("when", "")),
                None if item.get("others_busy") is None else float(item["others_busy"]),
            )
            out.append(record)
    return out


def add_verify_costs(record: VerifyCostRecord, path: Path | None = None) -> Path:
    """Keep ``record`` (replacing an earlier one of the same key), written atomically."""
    path = path or verify_costs_path()
    kept = [asdict(r) for r in load_verify_costs(path) if r.key != record.key][-(_MAX_RECORDS - 1) :]
    kept.append(asdict(record))
    return _write_json(path, kept, indent=1)

"""The prompts the speculation benchmark (``benchmarks/bench_speculation.py``) runs on every model: free chat and
counting (where drafting has little or nothing to copy: it must not slow decoding down) and three code edits
(where the reply copies most of the prompt: drafting should pay). Each comes as a completion prompt, for base
models without a chat template (Gemma 3 270M), and as a chat message, for instruct models (SmolLM2)."""

from __future__ import annotations

import json
from dataclasses import dataclass

PY_MODULE = '''import csv
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Reading:
    station: str
    day: str
    rain_mm: float
    max_temp_c: float


def load_readings(path: Path) -> list[Reading]:
    """Read a CSV file of daily readings, one row per station and day."""
    with path.open() as f:
        return [
            Reading(row["station"], row["day"], float(row["rain_mm"]), float(row["max_temp_c"]))
            for row in csv.DictReader(f)
        ]


def wettest_day(readings: list[Reading], station: str) -> Reading | None:
    """The reading of the station with the most rain, or None when the station has none."""
    mine = [r for r in readings if r.station == station]
    return max(mine, key=lambda r: r.rain_mm) if mine else None


def total_rain(readings: list[Reading], station: str) -> float:
    """All the rain the station measured, in millimetres."""
    return sum(r.rain_mm for r in readings if r.station == station)


def hot_days(readings: list[Reading], threshold_c: float = 30.0) -> list[Reading]:
    """Readings above the threshold, hottest first."""
    hot = [r for r in readings if r.max_temp_c > threshold_c]
    return sorted(hot, key=lambda r: r.max_temp_c, reverse=True)
'''

_SETTINGS = {
    "name": "weather-station",
    "version": 3,
    "stations": [
        {"id": "north", "lat": 52.52, "lon": 13.40, "sensors": ["rain", "temp", "wind"]},
        {"id": "harbour", "lat": 53.55, "lon": 9.99, "sensors": ["rain", "temp"]},
        {"id": "hill", "lat": 48.14, "lon": 11.58, "sensors": ["temp", "wind", "pressure"]},
    ],
    "upload": {"url": "https://example.org/api/readings", "every_minutes": 15, "retries": 3},
    "alerts": {"rain_mm_per_hour": 20, "max_temp_c": 35, "min_temp_c": -10},
}
JSON_2 = json.dumps(_SETTINGS, indent=2)
"""Settings as JSON indented by two spaces: to be re-indented by four."""

README_TEXT = """# weather-station

Collects rain, temperature and wind readings from small stations and uploads them every 15 minutes.

## Installation

Install it with pip:

    pip install weather-station

Then copy `settings.example.json` to `settings.json` and fill in your stations.

## Usage

Run `weather-station collect` on each station and `weather-station report` on the server.
The report lists the wettest day and the hottest days of each station.

## License

MIT
"""


@dataclass(frozen=True)
class Workload:
    name: str
    completion: str
    """The prompt for a base model (plain completion)."""
    chat: str
    """The user message for an instruct model."""
    copies: bool
    """The reply mostly copies the prompt (a code edit): drafting should pay here."""


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "free_chat",
        "The following is an essay about the history of the bicycle, from the first designs to modern racing "
        "bikes.\n\n",
        "Write an essay about the history of the bicycle, from the first designs to modern racing bikes.",
        copies=False,
    ),
    Workload(
        "counting",
        "Numbers from 1 to 300, one per line:\n1\n2\n3\n",
        "Write the numbers from 1 to 300, one per line.",
        copies=False,
    ),
    Workload(
        "rename_python",
        f"Original file:\n```python\n{PY_MODULE}```\n\nThe same file after renaming Reading to Measurement:\n"
        "```python\n",
        f"Rename the class Reading to Measurement in this Python module. Reply with the whole module.\n\n"
        f"```python\n{PY_MODULE}```",
        copies=True,
    ),
    Workload(
        "reindent_json",
        f"Settings, indented by two spaces:\n```json\n{JSON_2}\n```\n\nThe same settings, indented by four "
        "spaces:\n```json\n",
        f"Re-indent this JSON with four spaces instead of two. Reply with the whole JSON.\n\n```json\n{JSON_2}\n```",
        copies=True,
    ),
    Workload(
        "edit_readme",
        f"README.md:\n```markdown\n{README_TEXT}```\n\nThe same README.md, with the Installation section saying "
        "to install it with pipx instead of pip:\n```markdown\n",
        "Change the Installation section of this README to install with pipx instead of pip. Reply with the "
        f"whole README.\n\n```markdown\n{README_TEXT}```",
        copies=True,
    ),
)

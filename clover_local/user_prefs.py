"""Choices the app remembers: first-run answers and per-model chat settings, in one JSON file.

Pure Python (no Textual). Stored at ``settings.config_dir() / "prefs.json"``. A damaged file is not fatal:
it is renamed aside (``prefs.json.damaged``, see :mod:`clover_local.user_files`), the person is told, and the
app starts with defaults (people should not be locked out by a bad file, nor lose it to the next save).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from clover_local import settings
from clover_local.errors import CloverError, UsageError
from clover_local.plan.speculation import SPEC_MODES, SpecMode
from clover_local.presets import Preset
from clover_local.user_files import set_aside, write_atomically

OVERFLOW_CHOICES = ("ask", "drop", "summary")


@dataclass(frozen=True)
class ModelSettings:
    """Chat settings for one model, saved by the settings screen and used for every reply."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    ctx: int = 4096
    """Context size in tokens; a change reloads the model."""
    spec_mode: SpecMode = "auto"
    """Self-speculation (``--spec``), the one knob for it: auto, mtp, dflash, dspark, eagle3, ngram or off
    (``plan.speculation``). A drafter head runs in llama-server; a change reloads the model."""
    system_prompt: str = ""
    max_tokens: int = 1024
    diffusion_live: bool = True
    """Diffusion models: show the reply's current block being refined in place (masks turning into words)."""

    @staticmethod
    def from_preset(preset: Preset) -> ModelSettings:
        s = preset.sampling
        return ModelSettings(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            ctx=preset.ctx_default,
            spec_mode="auto" if preset.speculative.enabled else "off",
        )

    def validated(self) -> ModelSettings:
        """Self, or a UsageError saying which value is out of range and what range is allowed."""
        checks = (
            ("temperature", 0.0 <= self.temperature <= 5.0 and math.isfinite(self.temperature), "0 to 5"),
            ("top_p", 0.0 < self.top_p <= 1.0, "above 0, at most 1"),
            ("top_k", 0 <= self.top_k <= 1000, "0 (off) to 1000"),
            ("ctx", 256 <= self.ctx <= 1_048_576, "256 to 1048576 tokens"),
            ("max_tokens", 1 <= self.max_tokens <= 131_072, "1 to 131072"),
            ("spec_mode", self.spec_mode in SPEC_MODES, ", ".join(SPEC_MODES)),
        )
        for name, ok, allowed in checks:
            if not ok:
                raise UsageError(
                    f"The setting {name} = {getattr(self, name)!r} is out of range.", f"Use {allowed}."
                )
        return self


@dataclass(frozen=True)
class FirstRun:
    """What the first-run flow decided, so the next start goes straight to chat."""

    preset: str = ""
    quant: str = ""
    ctx: int = 0
    model_path: str = ""
    """The GGUF chosen or downloaded (first shard)."""
    kind: str = "preset"
    """``preset``: the preset's own download (its settings are the preset's); ``file``: a GGUF picked from
    disk, whose settings are its own (saved under its file name)."""

    @property
    def complete(self) -> bool:
        return bool(self.model_path) and Path(self.model_path).is_file()


@dataclass(frozen=True)
class Prefs:
    first_run: FirstRun = field(default_factory=FirstRun)
    models: dict[str, ModelSettings] = field(default_factory=dict)
    """Model key (preset name or GGUF file name) -> its chat settings."""
    theme: str = ""
    context_overflow: str = "ask"
    """When a chat outgrows the context: ``ask``, ``drop`` (leave out the oldest turns) or ``summary`` (a new
    chat carrying a summary)."""

    def settings_for(self, key: str, preset: Preset | None = None) -> ModelSettings:
        """Saved settings for a model, else the preset's defaults, else generic defaults."""
        if key in self.models:
            return self.models[key]
        return ModelSettings.from_preset(preset) if preset else ModelSettings()

    def with_model_settings(self, key: str, value: ModelSettings) -> Prefs:
        return replace(self, models={**self.models, key: value.validated()})

    def with_first_run(self, first_run: FirstRun) -> Prefs:
        return replace(self, first_run=first_run)


def prefs_path() -> Path:
    return settings.config_dir() / "prefs.json"


def load_prefs(path: Path | None = None) -> Prefs:
    """Remembered choices; defaults when there are none. A damaged file is renamed aside, with a
    notice (:func:`clover_local.user_files.take_notices`), and defaults are used."""
    path = path or prefs_path()
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return Prefs()
    except OSError as exc:
        set_aside(
            path, f"it cannot be read: {exc.strerror or exc}", "clover-local starts with default settings"
        )
        return Prefs()
    try:
        return _parse(json.loads(text.decode("utf-8")))
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text: byte {text[exc.start]:#04x} at position {exc.start}"
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except (ValueError, TypeError, UsageError) as exc:
        problem = str(exc.what if isinstance(exc, UsageError) else exc).rstrip(".")
    set_aside(path, problem, "clover-local starts with default settings")
    return Prefs()


def save_prefs(prefs: Prefs, path: Path | None = None) -> Path:
    path = path or prefs_path()
    data = {
        "first_run": asdict(prefs.first_run),
        "models": {k: asdict(v) for k, v in prefs.models.items()},
        "theme": prefs.theme,
        "context_overflow": prefs.context_overflow,
    }
    try:
        write_atomically(path, json.dumps(data, indent=2).encode("utf-8"), private=True)
    except OSError as exc:
        raise CloverError(
            f"Could not save your settings to {path}: {exc.strerror or exc}.",
            "Check that the folder is writable, or set CLOVER_CONFIG_DIR to another folder.",
        ) from None
    return path


def _parse(raw: object) -> Prefs:
    """Prefs from the decoded JSON; ValueError saying which part is wrong when it is not what
    :func:`save_prefs` writes."""
    top = _object(raw, "the file")
    fr = _object(top.get("first_run", {}), "first_run")
    first_run = FirstRun(
        preset=_text(fr, "preset", "first_run"),
        quant=_text(fr, "quant", "first_run"),
        ctx=_integer(fr, "ctx", "first_run"),
        model_path=_text(fr, "model_path", "first_run"),
        kind=_text(fr, "kind", "first_run") or "preset",
    )
    known = set(ModelSettings.__dataclass_fields__)
    models: dict[str, ModelSettings] = {}
    for key, value in _object(top.get("models", {}), "models").items():
        where = f"models.{key}"
        stored = _object(value, where)
        fields = {f: v for f, v in stored.items() if f in known}
        if stored.get("speculative") is False and "spec_mode" not in stored:
            fields["spec_mode"] = "off"  # the older second knob: speculative off is --spec off
        for name, v in fields.items():
            wanted = type(getattr(ModelSettings(), name))
            ok = isinstance(v, wanted) and (wanted is bool or not isinstance(v, bool))
            if wanted is float and isinstance(v, int) and not isinstance(v, bool):
                fields[name], ok = float(v), True
            if not ok:
                raise ValueError(f"{where}.{name} should be {wanted.__name__}, not {v!r}")
        models[key] = ModelSettings(**fields).validated()
    theme = top.get("theme", "")
    if not isinstance(theme, str):
        raise ValueError(f"theme should be text, not {theme!r}")
    overflow = top.get("context_overflow", "ask")
    if overflow not in OVERFLOW_CHOICES:
        raise ValueError(f"context_overflow should be one of {', '.join(OVERFLOW_CHOICES)}, not {overflow!r}")
    return Prefs(first_run=first_run, models=models, theme=theme, context_overflow=overflow)


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} should be a JSON object, not {json.dumps(value)[:40]}")
    return value


def _text(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} should be text, not {json.dumps(value)[:40]}")
    return value


def _integer(table: dict[str, Any], key: str, where: str) -> int:
    value = table.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where}.{key} should be a whole number, not {json.dumps(value)[:40]}")
    return value

"""Saved conversations and remembered preferences: round trips, listings, and damaged files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_local import conversations, settings, user_prefs
from clover_local.engine.types import ChatMessage
from clover_local.errors import CloverError, UsageError
from clover_local.presets import load_preset


def _conv(title: str = "", created: str = "2026-01-02T03:04:05+00:00") -> conversations.Conversation:
    msgs = (
        ChatMessage("user", "What is a mixture of experts?"),
        ChatMessage("assistant", "Many small FFNs."),
    )
    return conversations.Conversation(
        title=title or conversations.title_from(msgs),
        messages=msgs,
        system_prompt="Be brief.",
        model="gemma3-270m",
        created=created,
    )


def test_save_and_load_round_trip_in_data_dir() -> None:
    path = conversations.save(_conv())
    assert path.parent == settings.conversations_dir()
    loaded = conversations.load(path)
    assert loaded == _conv()


def test_listing_is_newest_first_and_skips_damaged_files() -> None:
    conversations.save(_conv("older", created="2026-01-01T00:00:00+00:00"))
    conversations.save(_conv("newer", created="2026-02-01T00:00:00+00:00"))
    (settings.conversations_dir() / "broken.json").write_text("{not json", encoding="utf-8")
    listing = conversations.list_saved()
    assert [s.title for s in listing] == ["newer", "older"]
    assert listing[0].n_messages == 2


def test_damaged_file_is_reported_with_its_name(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"messages": [{"role": "robot", "content": "hi"}]}), encoding="utf-8")
    with pytest.raises(CloverError, match=r"x\.json.*message 0 needs a role"):
        conversations.load(bad)
    with pytest.raises(CloverError, match="No saved conversation"):
        conversations.load(tmp_path / "missing.json")


def test_title_is_first_user_message_on_one_line() -> None:
    msgs = [ChatMessage("system", "s"), ChatMessage("user", "hello\n  there " + "x" * 100)]
    title = conversations.title_from(msgs, limit=20)
    assert title.startswith("hello there x") and len(title) == 20 and title.endswith("…")
    assert conversations.title_from([]) == "Untitled conversation"


def test_prefs_round_trip_and_per_model_settings() -> None:
    preset = load_preset("gemma3-270m")
    prefs = user_prefs.load_prefs()
    assert prefs == user_prefs.Prefs()
    defaults = prefs.settings_for("gemma3-270m", preset)
    assert defaults.temperature == preset.sampling.temperature and defaults.ctx == preset.ctx_default
    changed = prefs.with_model_settings("gemma3-270m", user_prefs.ModelSettings(temperature=0.3, ctx=2048))
    changed = changed.with_first_run(user_prefs.FirstRun(preset="gemma3-270m", quant="Q4_K_M", ctx=2048))
    user_prefs.save_prefs(changed)
    again = user_prefs.load_prefs()
    assert again.settings_for("gemma3-270m").temperature == 0.3
    assert again.first_run.quant == "Q4_K_M" and not again.first_run.complete


def test_out_of_range_setting_says_what_is_allowed() -> None:
    with pytest.raises(UsageError, match=r"(?s)top_p.*above 0, at most 1"):
        user_prefs.ModelSettings(top_p=1.5).validated()


def test_damaged_prefs_file_falls_back_to_defaults() -> None:
    path = user_prefs.prefs_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"models": {"m": {"temperature": "hot"}}}', encoding="utf-8")
    assert user_prefs.load_prefs() == user_prefs.Prefs()

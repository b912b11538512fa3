"""Damaged user files never stop clover-local: the file is named, kept (renamed aside), and defaults are
used; a preset named on the command line that cannot be read is a clear error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from waiting import wait_until

from clover_local import settings, user_files, user_prefs
from clover_local.cli import main
from clover_local.detect import parse_simulate
from clover_local.presets import load_preset
from clover_local.tui.app import CloverApp, StartOptions
from clover_local.tui.screens.plan import PlanScreen

DAMAGED = [
    b"[1,2,3]",
    b'"x"',
    b'{"first_run":"x"}',
    b'{"models":[1]}',
    b'{"models":{"m":{"temperature":"hot"}}}',
    b'{"first_run":{"ctx":"big"}}',
    b'{"theme": 7}',
    b"\xff\xfe\x00garbage",
    b'{"first_run": ',
]


@pytest.fixture(autouse=True)
def _no_leftover_notices() -> None:
    user_files.take_notices()


@pytest.mark.parametrize("content", DAMAGED, ids=lambda b: b.decode("latin-1")[:24])
def test_damaged_prefs_are_set_aside_named_and_defaults_used(content: bytes) -> None:
    path = user_prefs.prefs_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)

    assert user_prefs.load_prefs() == user_prefs.Prefs()

    aside = path.with_name("prefs.json.damaged")
    assert aside.read_bytes() == content and not path.exists()
    (notice,) = user_files.take_notices()
    assert str(path) in notice and str(aside) in notice and "default settings" in notice
    user_prefs.save_prefs(
        user_prefs.Prefs(theme="textual-light")
    )  # the next save leaves the damaged copy alone
    assert aside.read_bytes() == content
    assert user_prefs.load_prefs().theme == "textual-light" and user_files.take_notices() == []


def test_a_second_damaged_file_does_not_overwrite_the_first() -> None:
    path = user_prefs.prefs_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    for content in (b"[1]", b"[2]"):
        path.write_bytes(content)
        user_prefs.load_prefs()
    assert path.with_name("prefs.json.damaged").read_bytes() == b"[1]"
    assert path.with_name("prefs.json.damaged.2").read_bytes() == b"[2]"


async def test_the_app_starts_with_defaults_and_says_which_file_was_set_aside() -> None:
    path = user_prefs.prefs_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"models":[1]}')
    app = CloverApp(StartOptions(preset="clover-35b-a3b"), machine=parse_simulate("ram=64G"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(lambda: isinstance(app.screen, PlanScreen), "the plan screen", pilot=pilot)
        notes = [n.message for n in app._notifications]
        assert any(str(path) in n and "prefs.json.damaged" in n for n in notes), notes


def test_preset_naming_a_folder_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--preset", str(tmp_path) + "/", "--simulate", "ram=64G"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path}" in err and "is a folder" in err and "Traceback" not in err


def test_preset_file_not_utf8_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    assert main(["plan", "--preset", str(bad), "--simulate", "ram=64G"]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "not UTF-8" in err and "Traceback" not in err
    assert bad.exists()  # a file the person named is theirs: reported, not moved


def test_damaged_user_override_is_set_aside_and_the_shipped_preset_used(
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = settings.user_presets_dir()
    folder.mkdir(parents=True)
    override = folder / "gemma3-270m.toml"
    override.write_bytes(b"\xff\xfe not toml")
    assert load_preset("gemma3-270m").source != override
    assert (folder / "gemma3-270m.toml.damaged").exists() and not override.exists()
    (notice,) = user_files.take_notices()
    assert str(override) in notice and "not UTF-8" in notice and "shipped preset" in notice

    override.write_text("[architecture]\narch = 1\n", encoding="utf-8")
    assert main(["plan", "--preset", "gemma3-270m", "--simulate", "ram=64G"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and str(override) in err and "gemma3-270m.toml.damaged.2" in err

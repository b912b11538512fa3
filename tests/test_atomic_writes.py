"""Every file clover-local replaces in one step (saved conversations and their exports, the upstream release
cache, compare reports) goes through ``user_files.write_atomically``: a temporary name of its own each time,
so two writers at once never share one and a planted ``<name>.tmp`` link is never written through; and
conversations, which are personal, are 0600 in a 0700 folder (issue 27, cases 10 and 13)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from clover_local import conversations, settings
from clover_local.compare.report import CompareReport, load_report, save_report
from clover_local.engine.types import ChatMessage
from clover_local.runtimes import upstream


def _conv(text: str) -> conversations.Conversation:
    return conversations.Conversation(
        title="a private chat",
        messages=(ChatMessage("user", "my secret"), ChatMessage("assistant", text)),
        created="2026-01-02T03:04:05+00:00",
    )


def _report(tag: str) -> CompareReport:
    return CompareReport([], "builtin", tag * 64, [], {"max_tokens": 8}, complete=False)


def _save_conversation(folder: Path, n: int) -> Path:
    return conversations.save(_conv(f"reply {n}"), folder)


def _export_markdown(folder: Path, n: int) -> Path:
    return conversations.export(_conv(f"reply {n}"), folder)[1]


def _upstream_cache(folder: Path, n: int) -> Path:
    path = folder / "latest.json"
    upstream._write(path, f'{{"tag": "b{n}"}}')
    return path


def _compare_report(folder: Path, n: int) -> Path:
    path = folder / "run.json"
    save_report(_report("ab"[n]), path)
    return path


WRITERS: dict[str, Callable[[Path, int], Path]] = {
    "conversation": _save_conversation,
    "markdown export": _export_markdown,
    "upstream cache": _upstream_cache,
    "compare report": _compare_report,
}


def _whole(path: Path) -> bool:
    """The file is one writer's complete output (JSON or Markdown that reads back)."""
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8").startswith("# a private chat")
    if path.name == "run.json":
        return load_report(path).tasks_digest in ("a" * 64, "b" * 64)
    if path.name == "latest.json":
        return path.read_text(encoding="utf-8") in ('{"tag": "b0"}', '{"tag": "b1"}')
    return conversations.load(path).messages[1].content in ("reply 0", "reply 1")


@pytest.mark.parametrize("writer", WRITERS)
def test_two_writers_at_once_each_write_through_a_name_of_their_own(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers have written their temporary file before either renames it (a barrier in os.replace):
    with one fixed ``.tmp`` name the second truncated the first's and one rename found nothing."""
    folder = tmp_path / "out"
    both_written = threading.Barrier(2, timeout=30)
    renamed: list[str] = []
    real_replace = os.replace

    def replace_when_both_wrote(src: str | Path, dst: str | Path) -> None:
        renamed.append(os.fspath(src))
        both_written.wait()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_when_both_wrote)
    results: list[Path] = []
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            results.append(WRITERS[writer](folder, n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(renamed) == len(set(renamed)), f"a temporary name was shared: {renamed}"
    assert len(results) == 2 and results[0] == results[1] and _whole(results[0])
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")], "no temporary left behind"


@pytest.mark.parametrize("writer", WRITERS)
def test_a_planted_tmp_link_is_not_written_through(writer: str, tmp_path: Path) -> None:
    """Another local user plants ``<name>.tmp`` (every fixed name the old code used) as a link to a file of
    the victim's: the write must not follow it."""
    folder = tmp_path / "out"
    target = WRITERS[writer](folder, 0)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    for fixed in (f"{target.name}.tmp", f".{target.name}.tmp", target.with_suffix(".json.tmp").name):
        (folder / fixed).unlink(missing_ok=True)
        (folder / fixed).symlink_to(victim)
    WRITERS[writer](folder, 1)
    assert victim.read_text() == "untouched"
    assert _whole(target)


def test_exported_conversations_are_private_in_a_private_folder() -> None:
    """The chat screen's export (``conversations.export`` in the data dir): the JSON and the Markdown 0600,
    the folder 0700, also when an older version had made that folder 0755 and left a 0644 file in it."""
    folder = settings.conversations_dir()
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    json_path, md_path = conversations.export(_conv("reply 0"))
    assert json_path.parent == folder == md_path.parent
    assert stat.S_IMODE(json_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(md_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    json_path.chmod(0o644)  # written by an older version
    again, _ = conversations.export(_conv("reply 1"))
    assert again == json_path and stat.S_IMODE(json_path.stat().st_mode) == 0o600


def test_a_new_data_dir_is_made_private_for_the_conversations(tmp_path: Path) -> None:
    folder = tmp_path / "new-data" / "conversations"
    path = conversations.save(_conv("reply 0"), folder)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700

"""Installing llama.cpp runtimes from the releases stand-in: a real llama-server installed from an archive runs;
digests are enforced; the releases server's failures (nothing listening, offline, rate limits, malformed answers)
are said plainly; the token never leaves the API's origin; list and remove."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from pathlib import Path

import pytest
from helpers_runtimes import (
    ARCH_CPP,
    PINNED_BIN,
    pinned_runtime_archive,
    publish,
    releases,
    script_runtime,
    tar_gz,
)
from releases_server import ReleasesServer
from waiting import wait_until

from clover_local import settings
from clover_local.errors import InstallCancelled, NoArchiveError, RuntimeInstallError, UsageError
from clover_local.runtimes.assets import Target
from clover_local.runtimes.install import clear_stale_downloads, downloads_dir, install, remove
from clover_local.runtimes.installed import installed_runtimes
from clover_local.runtimes.releases import fetch_release, fetch_source_file

__all__ = ["releases"]  # the fixture

CPU = Target("linux", "x64", ("cpu",))


def _nothing_installed() -> None:
    base = settings.runtimes_dir()
    assert installed_runtimes() == ()
    left = [p.name for p in base.iterdir() if p.is_dir() and p.name != ".downloads"] if base.is_dir() else []
    assert left == [], f"left behind: {left}"


@pytest.fixture(scope="session")
def real_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pinned_runtime_archive(tmp_path_factory.mktemp("real-runtime"), "b9100")


@pytest.mark.slow
def test_an_archive_with_the_real_llama_server_installs_and_runs(
    releases: ReleasesServer, real_archive: Path
) -> None:
    publish(releases, "b9100", real_archive)
    kept = PINNED_BIN / "llama-arch.cpp"
    if kept.is_file():  # the pinned build's own table, as a release would serve its source
        releases.add_raw("b9100", "src/llama-arch.cpp", kept.read_bytes())
    if (PINNED_BIN / "arg.cpp").is_file():
        releases.add_raw("b9100", "common/arg.cpp", (PINNED_BIN / "arg.cpp").read_bytes())
    runtime = install("latest", target=CPU)
    assert runtime.tag == "b9100" and runtime.origin == "archive" and runtime.backend == "cpu"
    assert runtime.server == (settings.runtimes_dir() / "b9100" / "llama-server").resolve()
    done = subprocess.run([str(runtime.server), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "version:" in (done.stdout + done.stderr)
    assert runtime.arch_source.is_file() and runtime.arg_source.is_file()
    assert runtime.sha256 == hashlib.sha256(real_archive.read_bytes()).hexdigest()
    assert installed_runtimes() == (runtime,)


def test_an_archive_installs_with_its_manifest_and_sources(releases: ReleasesServer) -> None:
    data = tar_gz(script_runtime("b9001"))
    name = publish(releases, "b9001", data)
    heard: list[str] = []
    runtime = install("b9001", target=CPU, notify=heard.append)
    root = settings.runtimes_dir() / "b9001"
    manifest = json.loads((root / "runtime.json").read_text())
    assert manifest["tag"] == "b9001" and manifest["origin"] == "archive" and manifest["backend"] == "cpu"
    assert manifest["server"] == "llama-server"  # the top folder llama-b9001/ is stripped
    assert manifest["asset"] == name and manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["assets"] == [{"name": name, "sha256": manifest["sha256"], "verified": True}]
    assert (root / "llama-arch.cpp").read_text() == ARCH_CPP
    assert "common_arg" in (root / "arg.cpp").read_text()
    assert (root / "llama-server").stat().st_mode & 0o111  # the executable bit survived
    assert (root / "LICENSE").stat().st_mode & 0o777 == 0o644
    assert installed_runtimes() == (runtime,)
    assert not any((settings.runtimes_dir() / ".downloads").iterdir())  # the archive is gone once installed
    assert any("architectures" in m for m in heard)


def test_an_installed_tag_is_said_to_be_installed_unless_forced(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    first = install("b9001", target=CPU)
    heard: list[str] = []
    again = install("b9001", target=CPU, notify=heard.append)
    assert again == first
    assert any("already installed" in m for m in heard)
    gets = len(releases.downloads("llama-b9001-bin-ubuntu-x64.tar.gz"))
    forced = install("b9001", target=CPU, force=True)
    assert len(releases.downloads("llama-b9001-bin-ubuntu-x64.tar.gz")) == gets + 1
    assert forced.installed >= first.installed and installed_runtimes() == (forced,)


def test_a_wrong_digest_is_refused_and_nothing_is_installed(releases: ReleasesServer) -> None:
    name = publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    releases.knobs("b9001", name).wrong_digest = True
    with pytest.raises(RuntimeInstallError, match="arrived corrupt") as caught:
        install("b9001", target=CPU)
    assert "nothing was installed" in str(caught.value)
    _nothing_installed()
    assert [
        p for p in (settings.runtimes_dir() / ".downloads").rglob("*") if p.is_file()
    ] == []  # no part kept


def test_an_asset_without_a_digest_needs_the_explicit_flag(releases: ReleasesServer) -> None:
    data = tar_gz(script_runtime("b9001"))
    name = publish(releases, "b9001", data)
    releases.knobs("b9001", name).no_digest = True
    with pytest.raises(RuntimeInstallError, match="no sha256 digest") as caught:
        install("b9001", target=CPU)
    assert "--allow-unverified" in str(caught.value)
    _nothing_installed()
    runtime = install("b9001", target=CPU, allow_unverified=True)
    manifest = json.loads((runtime.root / "runtime.json").read_text())
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["assets"][0]["verified"] is False


def test_a_dropped_connection_is_continued_with_a_range(releases: ReleasesServer) -> None:
    name = publish(releases, "b9001", tar_gz(script_runtime("b9001", padding=600_000)))
    releases.knobs("b9001", name).drop_after = 200_000
    install("b9001", target=CPU)
    ranges = [r.range for r in releases.downloads(name)]
    assert ranges[0] is None and ranges[1] is not None and int(ranges[1].split("=")[1].rstrip("-")) >= 200_000


def test_nothing_listening_is_a_clear_error(
    releases: ReleasesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    releases.stop()
    with pytest.raises(RuntimeInstallError, match="unreachable") as caught:
        install("latest", target=CPU)
    assert "internet connection" in str(caught.value)
    _nothing_installed()


def test_offline_mode_asks_no_server(releases: ReleasesServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RuntimeInstallError, match="offline mode is on"):
        install("latest", target=CPU)
    assert releases.requests == []


def test_a_rate_limit_is_said_to_be_one(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    releases.rate_limited = True
    with pytest.raises(RuntimeInstallError, match="rate-limiting this machine \\(403\\)") as caught:
        fetch_release("latest")
    assert "GITHUB_TOKEN" in str(caught.value)


def test_an_unknown_tag_and_a_malformed_tag(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    with pytest.raises(RuntimeInstallError, match="no release b1234"):
        fetch_release("b1234")
    with pytest.raises(RuntimeInstallError, match=r"not a llama\.cpp release tag"):
        fetch_release("../../etc")
    assert all(".." not in r.path for r in releases.requests)


def test_a_malformed_answer_is_refused(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    original = releases.release_json

    def hostile(release, host):  # type: ignore[no-untyped-def]
        payload = original(release, host)
        payload["assets"][0]["name"] = "../../outside.tar.gz"
        return payload

    releases.release_json = hostile  # type: ignore[method-assign]
    with pytest.raises(RuntimeInstallError, match="not a plain file name"):
        fetch_release("b9001")


def test_the_token_goes_to_the_api_and_never_to_a_redirect(
    releases: ReleasesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_test_token")
    name = publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    releases.knobs("b9001", name).redirect_host = "localhost"
    install("b9001", target=CPU)
    api = [r for r in releases.requests if "/releases/" in r.path]
    assert api and all(r.authorization == "Bearer ghp_test_token" for r in api)
    hops = releases.downloads(name)
    assert [r.status for r in hops] == [302, 200]
    assert hops[0].host.startswith("127.0.0.1") and hops[1].host.startswith("localhost")
    assert hops[1].authorization is None


def test_list_and_remove(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")), latest=False)
    publish(releases, "b9002", tar_gz(script_runtime("b9002")))
    older = install("b9001", target=CPU)
    newer = install("latest", target=CPU)
    assert installed_runtimes() == (newer, older)  # newest release first
    assert remove("b9002") == settings.runtimes_dir() / "b9002"
    assert installed_runtimes() == (older,)
    with pytest.raises(RuntimeInstallError, match="not installed"):
        remove("b9002")
    with pytest.raises(UsageError):
        remove("../b9001")


def test_no_archive_for_this_machine_goes_to_a_source_build(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    heard: list[str] = []
    with pytest.raises(RuntimeInstallError, match="tarball"):
        # the stand-in has no source tarball for this tag: the build is where it stops
        install("b9001", target=Target("linux", "riscv64", ("cpu",)), notify=heard.append)
    assert any("building it from source" in m for m in heard)
    _nothing_installed()


def test_the_tags_source_files_come_from_the_raw_base(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    assert fetch_source_file("b9001", "src/llama-arch.cpp").decode() == ARCH_CPP


def test_a_source_file_that_is_not_llama_cpps_is_refused(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")), sources=False)
    with pytest.raises(RuntimeInstallError, match=r"does not exist \(404\)"):
        install("b9001", target=CPU)
    _nothing_installed()
    releases.add_raw("b9001", "src/llama-arch.cpp", "<html>a mirror's error page</html>")
    with pytest.raises(RuntimeInstallError, match="no architecture table"):
        install("b9001", target=CPU)
    _nothing_installed()
    releases.add_raw("b9001", "src/llama-arch.cpp", ARCH_CPP)
    releases.add_raw("b9001", "common/arg.cpp", "not it")
    with pytest.raises(RuntimeInstallError, match="no option table"):
        install("b9001", target=CPU)
    _nothing_installed()


def _stale_part(tag: str) -> Path:
    """What a killed or cancelled install of ``tag`` leaves: a part file in that tag's download folder."""
    part = downloads_dir(tag) / f"llama-{tag}-bin-ubuntu-x64.tar.gz.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(b"half an archive")
    return part


def test_stale_downloads_of_other_tags_go_when_an_install_finishes(releases: ReleasesServer) -> None:
    import filelock

    publish(releases, "b9002", tar_gz(script_runtime("b9002")))
    stale, running = _stale_part("b9001"), _stale_part("b9003")
    loose = settings.runtimes_dir() / ".downloads" / "llama-b9000-bin-ubuntu-x64.tar.gz.part"  # older layout
    loose.write_bytes(b"older")
    busy = filelock.FileLock(str(settings.runtimes_dir() / ".lock-b9003"))  # an install of b9003 is running
    with busy:
        install("b9002", target=CPU)
        assert running.is_file(), "the download of a tag being installed is kept"
    assert not stale.exists() and not loose.exists()
    assert [p.name for p in (settings.runtimes_dir() / ".downloads").iterdir()] == ["b9003"]
    assert clear_stale_downloads() == (downloads_dir("b9003"),)  # its install is over now
    assert list((settings.runtimes_dir() / ".downloads").iterdir()) == []


def test_remove_clears_stale_downloads(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    install("b9001", target=CPU)
    stale = _stale_part("b9002")
    remove("b9001")
    assert not stale.exists() and list((settings.runtimes_dir() / ".downloads").iterdir()) == []


def test_a_cancelled_install_installs_nothing_and_keeps_its_part(releases: ReleasesServer) -> None:
    name = publish(releases, "b9001", tar_gz(script_runtime("b9001", padding=600_000)))
    releases.knobs("b9001", name).hold_at = 200_000
    cancel = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            install("b9001", target=CPU, cancel=cancel)
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    part = downloads_dir("b9001") / (name + ".part")
    wait_until(lambda: releases.held_streams == 1, "the transfer held at 200 kB")
    # The server has sent 200 kB; the client writes them as they come out of the socket. Cancel once they are
    # on disk, not while some still sit in the socket's buffer (a race a fast server wins and a slow client loses).
    wait_until(
        lambda: part.exists() and part.stat().st_size >= 200_000, "the 200 kB sent written to the part"
    )
    cancel.set()  # the person presses Esc mid-transfer
    releases.knobs("b9001", name).hold_at = None  # the next bytes arrive and meet the cancel
    worker.join()
    assert len(failures) == 1 and isinstance(failures[0], InstallCancelled)
    assert "nothing was installed" in str(failures[0])
    _nothing_installed()
    assert part.stat().st_size >= 200_000, "kept: the next install continues it"
    install("b9001", target=CPU)
    assert releases.downloads(name)[-1].range is not None
    assert not downloads_dir("b9001").exists()


def test_no_archive_can_be_asked_about_before_a_source_build(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    with pytest.raises(NoArchiveError, match="no prebuilt archive for linux riscv64") as caught:
        install("b9001", target=Target("linux", "riscv64", ("cpu",)), build_if_no_archive=False)
    assert "from its source" in str(caught.value) and caught.value.tag == "b9001"
    assert not any("/tarball/" in r.path for r in releases.requests)  # nothing of the source was fetched
    _nothing_installed()

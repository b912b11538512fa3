"""Hostile release archives: every kind of member that would land outside the runtime folder (or is not a plain
file, folder or inner link) is refused through the real install, with nothing installed and nothing written
outside; the size and member caps stop archive bombs; links that stay inside are kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers_runtimes import SCRIPT_SERVER, Member, publish, releases, script_runtime, tar_gz, zip_bytes
from releases_server import ReleasesServer

from clover_local import settings
from clover_local.errors import RuntimeInstallError
from clover_local.runtimes.assets import Target
from clover_local.runtimes.extract import extract_archive
from clover_local.runtimes.install import install
from clover_local.runtimes.installed import installed_runtimes

__all__ = ["releases"]

CPU = Target("linux", "x64", ("cpu",))
TOP = "llama-b9001"
SERVER = Member(f"{TOP}/llama-server", SCRIPT_SERVER, 0o755)

HOSTILE = {
    "dot-dot": [SERVER, Member(f"{TOP}/../../escaped.txt", b"out")],
    "dot-dot-inside-name": [SERVER, Member(f"{TOP}/lib/../../../escaped.txt", b"out")],
    "absolute": [SERVER, Member("/tmp/clover-escaped.txt", b"out")],
    "drive-letter": [SERVER, Member("C:/escaped.txt", b"out")],
    "backslash": [SERVER, Member(f"{TOP}\\..\\escaped.txt", b"out")],
    "symlink-out": [SERVER, Member(f"{TOP}/libggml.so", kind="symlink", link="../../../../etc/passwd")],
    "symlink-absolute": [SERVER, Member(f"{TOP}/libggml.so", kind="symlink", link="/etc/passwd")],
    "write-through-symlink": [
        SERVER,
        Member(f"{TOP}/here", kind="symlink", link="."),
        Member(f"{TOP}/here/x", kind="symlink", link="../../escaped"),
    ],
    "hardlink-out": [SERVER, Member(f"{TOP}/libggml.so", kind="hardlink", link="/etc/passwd")],
    "hardlink-to-nothing": [SERVER, Member(f"{TOP}/libggml.so", kind="hardlink", link=f"{TOP}/missing")],
    "fifo": [SERVER, Member(f"{TOP}/pipe", kind="fifo")],
    "device": [SERVER, Member(f"{TOP}/null", kind="chardev")],
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_tar_member_is_refused_and_nothing_installed(
    kind: str, releases: ReleasesServer, tmp_path: Path
) -> None:
    publish(releases, "b9001", tar_gz(HOSTILE[kind]))
    with pytest.raises(RuntimeInstallError, match="Refusing to unpack") as caught:
        install("b9001", target=CPU)
    assert "Nothing was installed" in str(caught.value)
    assert installed_runtimes() == ()
    base = settings.runtimes_dir()
    assert [p.name for p in base.iterdir() if p.is_dir()] == [".downloads"]  # the partial folder is gone
    assert not (base.parent / "escaped.txt").exists() and not (base / "escaped.txt").exists()
    assert not Path("/tmp/clover-escaped.txt").exists()


@pytest.mark.parametrize(
    "members",
    [
        [SERVER, Member(f"{TOP}/../escaped.txt", b"out")],
        [SERVER, Member(f"{TOP}/libggml.so", kind="symlink", link="../../outside")],
        [SERVER, Member("/abs.txt", b"out")],
    ],
    ids=["dot-dot", "symlink-out", "absolute"],
)
def test_a_hostile_zip_member_is_refused(members: list[Member], releases: ReleasesServer) -> None:
    publish(releases, "b9001", zip_bytes(members), name="llama-b9001-bin-ubuntu-x64.zip")
    with pytest.raises(RuntimeInstallError, match="Refusing to unpack"):
        install("b9001", target=CPU)
    assert installed_runtimes() == ()


def test_links_inside_the_folder_and_executable_bits_are_kept(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(
        tar_gz(
            [
                *script_runtime("b9001"),
                Member(f"{TOP}/libllama.so.0", b"\x7fELF", 0o755),
                Member(f"{TOP}/libllama.so", kind="symlink", link="libllama.so.0"),
                Member(f"{TOP}/copy.so", kind="hardlink", link=f"{TOP}/libllama.so.0"),
                Member(f"{TOP}/sub/", kind="dir"),
                Member(f"{TOP}/sub/up.so", kind="symlink", link="../libllama.so.0"),
            ]
        )
    )
    into = tmp_path / "out"
    extract_archive(archive, into)
    assert os.readlink(into / "libllama.so") == "libllama.so.0"
    assert (into / "sub" / "up.so").read_bytes() == b"\x7fELF"
    assert (into / "copy.so").read_bytes() == b"\x7fELF"
    assert (into / "llama-server").stat().st_mode & 0o777 == 0o755
    assert (into / "LICENSE").stat().st_mode & 0o777 == 0o644


def test_the_unpacked_size_cap_stops_a_bomb(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(tar_gz([SERVER, Member(f"{TOP}/zeros", b"\0" * 3_000_000)]))  # compresses to a few kB
    assert archive.stat().st_size < 20_000
    with pytest.raises(RuntimeInstallError, match="unpacks to more than"):
        extract_archive(archive, tmp_path / "out", max_bytes=1_000_000)


def test_the_member_cap(tmp_path: Path) -> None:
    archive = tmp_path / "many.zip"
    archive.write_bytes(zip_bytes([Member(f"{TOP}/f{i}", b"x") for i in range(50)]))
    with pytest.raises(RuntimeInstallError, match="50 members, more than the 20 allowed"):
        extract_archive(archive, tmp_path / "out", max_members=20)


def test_a_damaged_archive_is_said_to_be_unreadable(tmp_path: Path) -> None:
    archive = tmp_path / "broken.tar.gz"
    archive.write_bytes(tar_gz(script_runtime("b9001"))[:100])
    with pytest.raises(RuntimeInstallError, match="not a readable archive"):
        extract_archive(archive, tmp_path / "out")

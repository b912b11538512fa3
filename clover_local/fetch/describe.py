"""Describe every quant of a preset for the planner, with exact sizes per tensor wherever they can be had before
anything is downloaded. For each quant, in order of preference:

1. a local file: the ``local_path`` given, else the quant's file on this machine as every command finds it
   (:func:`.local_quant.local_quant_file`: packaged, downloaded, or the first run's choice): its GGUF header;
2. the GGUF header on the Hub (:mod:`.remote_header`: range requests, a few MB of a 23 GB file, cached, so read
   once and offline afterwards);
3. the preset's estimate (its ``fallback_bytes``), with a note saying why nothing better was found.

The Hub is asked at most once per repo listing and per header, with a short timeout per request
(``HF_HUB_ETAG_TIMEOUT``, 10 s by default), no waiting out of rate limits, and nothing more after the first
sign it is unreachable. Network failures never raise: they become notes. The planner stays pure: it gets the
descriptions from here."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from clover_local import settings
from clover_local.errors import CloverError, DownloadError, GGUFError, HubUnreachableError
from clover_local.fetch.local import packaged_model
from clover_local.fetch.quants import quant_matches, select_quant_files
from clover_local.fetch.sidecars import DraftKind
from clover_local.gguf.model import ModelDescription, describe_from_preset
from clover_local.presets import Preset, QuantSpec

__all__ = ["QuantDescriptions", "describe_quants"]


@dataclass(frozen=True)
class QuantDescriptions:
    """What the planner should know about each quant of a preset, and where it came from."""

    models: dict[str, ModelDescription]
    """Quant name -> description (exact when read from a header, else the preset's estimate)."""
    notes: tuple[str, ...]
    """One line per quant: ``Q4_K_M: exact, from the GGUF header of X.gguf on the Hub``."""
    sources: dict[str, str] = field(default_factory=dict)
    """Quant name -> the note's text without the quant (``exact, from the downloaded file X.gguf``)."""
    paths: dict[str, Path] = field(default_factory=dict)
    """Quants present on this machine -> the file llama.cpp would load (first shard)."""
    sidecars: dict[str, dict[DraftKind, tuple[str, ModelDescription | None]]] = field(default_factory=dict)
    """Quant -> drafter sidecars the repo has for it (``fetch.sidecars`` ranking): kind -> (local path when
    downloaded, else the repo file name; its header when it could be read, exact like the model's)."""

    @property
    def exact(self) -> bool:
        """True when every quant's sizes come from a GGUF header."""
        return all(d.exact for d in self.models.values())


def describe_quants(
    preset: Preset,
    *,
    local_path: Path | None = None,
    offline: bool | None = None,
    timeout_s: float | None = None,
    quants: Iterable[str] | None = None,
) -> QuantDescriptions:
    """Describe each quant of ``preset``: from a local file, else the Hub's GGUF header, else the preset.

    ``local_path``: a GGUF the person named; it describes the quant it is (by its header's file type or its
    name). ``offline`` (None: ``HF_HUB_OFFLINE``): ask no server, use only local files and cached headers.
    ``timeout_s`` (None: ``HF_HUB_ETAG_TIMEOUT``) bounds each wait for the Hub. ``quants``: only these
    (default: all the preset offers). A local file that is not a readable GGUF raises :class:`GGUFError`;
    nothing about the Hub raises.
    """
    from huggingface_hub import constants

    offline = settings.hf_offline() if offline is None else offline
    timeout = float(constants.HF_HUB_ETAG_TIMEOUT) if timeout_s is None else timeout_s
    hub = _HubView(preset.repo, offline=offline, timeout_s=timeout)
    local = _LocalFiles(preset, local_path)
    models: dict[str, ModelDescription] = {}
    sources: dict[str, str] = {}
    paths: dict[str, Path] = {}
    sidecars: dict[str, dict[DraftKind, tuple[str, ModelDescription | None]]] = {}
    wanted = set(preset.quants if quants is None else quants)
    for quant, spec in preset.quants.items():
        if quant not in wanted:
            continue
        if (found := local.describe(quant, spec)) is not None:
            models[quant], sources[quant], paths[quant] = found
            # A downloaded quant runs with the sidecars downloaded with it (none after --no-draft).
            sidecars[quant] = _local_sidecars(preset, quant)
            continue
        models[quant], sources[quant] = hub.describe(preset, quant, spec, local.problems.get(quant))
        sidecars[quant] = hub.sidecars(spec)
    notes = tuple(f"{q}: {text}" for q, text in sources.items())
    return QuantDescriptions(models=models, notes=notes, sources=sources, paths=paths, sidecars=sidecars)


def _local_sidecars(preset: Preset, quant: str) -> dict[DraftKind, tuple[str, ModelDescription | None]]:
    """Drafter sidecars downloaded with the quant, described from their headers."""
    from clover_local.fetch.download import cached_sidecars
    from clover_local.gguf.header import header_of

    if preset.python_package:
        return {}
    return {
        kind: _sidecar(str(path), functools.partial(header_of, path))
        for kind, path in cached_sidecars(preset, quant).items()
    }


def _sidecar(name: str, read: Callable[[], ModelDescription]) -> tuple[str, ModelDescription | None]:
    """A sidecar's name and its header (``read``), None when it cannot be read."""
    try:
        return name, read()
    except CloverError:
        return name, None


class _LocalFiles:
    """GGUFs on this machine: the one named, the preset's packaged file, downloads in the HF cache."""

    def __init__(self, preset: Preset, local_path: Path | None) -> None:
        self.preset = preset
        self.problems: dict[str, str] = {}
        """Quant -> why its downloaded file could not be used (said when the Hub cannot help either)."""
        self._named = self._read(local_path, "the local file") if local_path is not None else None

    def describe(self, quant: str, spec: QuantSpec) -> tuple[ModelDescription, str, Path] | None:
        if self._named is not None:
            path, desc = self._named
            if _same_quant(desc, quant) or quant_matches(path.name, spec.pattern):
                return desc, f"exact, from the local file {path}", path
        if (packaged := self._packaged) is not None:
            path, desc = packaged
            if _same_quant(desc, quant) or len(self.preset.quants) == 1:
                return desc, f"exact, from the downloaded file {path.name}", path
        return self._downloaded(quant)

    def _downloaded(self, quant: str) -> tuple[ModelDescription, str, Path] | None:
        from clover_local.fetch.local_quant import local_quant_file
        from clover_local.gguf.header import header_of

        path = local_quant_file(replace(self.preset, python_package=None), quant)  # packaged: asked above
        if path is None:
            return None
        try:
            desc = header_of(path)
        except GGUFError as exc:
            self.problems[quant] = f"the downloaded file could not be read ({exc.what})"
            return None
        return desc, f"exact, from the downloaded file {path.name}", path

    @functools.cached_property
    def _packaged(self) -> tuple[Path, ModelDescription] | None:
        """The file assembled from the preset's Python package (built once), when the package is installed."""
        path = packaged_model(self.preset) if self.preset.python_package else None
        return self._read(path, "the packaged model") if path is not None else None

    @staticmethod
    def _read(path: Path, what: str) -> tuple[Path, ModelDescription]:
        from clover_local.gguf.header import header_of

        path = Path(path).expanduser()
        if not path.is_file():
            raise GGUFError(f"{what} {path} does not exist.", "Give the path of a local .gguf file.")
        return path, header_of(path)


def _same_quant(desc: ModelDescription, quant: str) -> bool:
    return desc.quant is not None and desc.quant.upper() == quant.upper()


class _HubView:
    """The preset's repo as the Hub (or, without it, the header cache) shows it; asks each thing once."""

    def __init__(self, repo: str, *, offline: bool, timeout_s: float) -> None:
        self.repo = repo
        self.timeout_s = timeout_s
        self.down: str | None = "offline (HF_HUB_OFFLINE=1 or --offline)" if offline else None
        """Why the Hub is not asked (any more); None while it may be."""
        self._paths: list[str] | None = None
        self._listing_error: DownloadError | None = None

    def describe(
        self, preset: Preset, quant: str, spec: QuantSpec, local_problem: str | None
    ) -> tuple[ModelDescription, str]:
        """The quant's header from the Hub (or the header cache), else the preset's estimate with why."""
        try:
            filename = self._first_shard(spec)
            was_down = self.down
            desc = self._header(filename)
        except HubUnreachableError:
            why = f"{self.down}, and its header was never read here"
        except CloverError as exc:  # not found, gated, a broken header: nothing more to learn from the Hub
            why = exc.what
        else:
            where = f"exact, from the GGUF header of {filename} on the Hub"
            if was_down is not None:
                where += f" (read earlier and cached; now {was_down})"
            return desc, where
        if local_problem:
            why = f"{local_problem}; {why}"
        estimate = describe_from_preset(preset, quant)  # its size is the plan's and the alternatives' to say
        return estimate, f"estimated from the preset: {why}"

    def sidecars(self, spec: QuantSpec) -> dict[DraftKind, tuple[str, ModelDescription | None]]:
        """The drafter sidecars the repo lists for the quant, each with its header read like the model's
        (None when it cannot be read: offline and never cached, say). Empty when the repo is not reachable."""
        from clover_local.fetch.download import sidecars_for

        try:
            paths = self._repo_paths()
            model_file = self._first_shard(spec)
        except CloverError:
            return {}
        return {
            kind: _sidecar(name, functools.partial(self._header, name))
            for kind, name in sidecars_for(paths, model_file, spec.pattern).items()
        }

    def _header(self, filename: str) -> ModelDescription:
        """``filename``'s header from the Hub (or the header cache); the first unreachable Hub sets ``down``."""
        from clover_local.fetch.remote_header import read_remote_header

        try:
            return read_remote_header(
                self.repo, filename, offline=self.down is not None, timeout_s=self.timeout_s, retries=0
            )
        except HubUnreachableError as exc:
            if self.down is None:
                self.down = _unreachable(exc)
            raise

    def _first_shard(self, spec: QuantSpec) -> str:
        """The quant's file (first shard) in the repo listing, or among cached headers without the Hub."""
        paths = self._repo_paths()
        try:
            return select_quant_files(self.repo, paths, spec.pattern)[0]
        except DownloadError:
            if self.down is not None:  # the cache simply never saw it
                raise HubUnreachableError(self.down) from None
            raise

    def _repo_paths(self) -> list[str]:
        from clover_local.fetch import hub
        from clover_local.fetch.remote_header import cached_header_files

        if self._listing_error is not None:
            raise self._listing_error
        if self._paths is None and self.down is None:
            try:
                listing = hub.list_repo(self.repo, "main", timeout_s=self.timeout_s, retries=0)
                self._paths = [e.path for e in listing.entries]
            except HubUnreachableError as exc:
                self.down = _unreachable(exc)
            except DownloadError as exc:
                self._listing_error = exc
                raise
        if self._paths is None:
            self._paths = cached_header_files(self.repo)
        return self._paths


def _unreachable(exc: HubUnreachableError) -> str:
    """The error's sentence, to follow "estimated from the preset: " (lower-case start, no full stop)."""
    text = exc.what.rstrip(".")
    return text[:1].lower() + text[1:]

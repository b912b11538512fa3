"""Ask a preset's community GGUF repos (``[[community]]``) for smaller quants: each repo listed once, and the
GGUF headers of the few quants worth reading (``plan.community.shortlist``: smaller than the quant that did not
fit, no larger than what this machine could hold, best quality first) read with range requests, a few MB each,
and cached like the preset's own (``fetch.remote_header``). The answer is a value for the pure choice
(``plan.community.choose_community_quant``); nothing here raises for the Hub: a repo that cannot be asked
becomes a sentence, and so does a file whose header its runtime would refuse (``gguf.loadable``: it is not
offered). Offline nothing is asked: the files the preset lists with the sizes their pages give are weighed
from those sizes, and a sentence names the repos that would be asked. Where the Hub cannot be reached (no route,
no name resolution, a timeout) the same listings are weighed, with a sentence saying why.
"""

from __future__ import annotations

from dataclasses import replace

from clover_local import settings
from clover_local.errors import CloverError, DownloadError, GGUFError, HubUnreachableError
from clover_local.fetch.quants import quant_matches, select_quant_files
from clover_local.fetch.repo_preset import preset_for_repo
from clover_local.gguf.loadable import load_problem
from clover_local.gguf.model import ModelDescription, describe_from_preset
from clover_local.plan.community import CommunityQuant, CommunityQuants, from_listings, shortlist
from clover_local.presets import CommunityListing, Preset

__all__ = ["find_community_quants"]

TIMEOUT_S = 10.0
"""Each wait for the Hub at most (as a plan's own header reads)."""


def find_community_quants(
    preset: Preset,
    *,
    below_bytes: int,
    room_bytes: int,
    offline: bool | None = None,
    timeout_s: float = TIMEOUT_S,
) -> CommunityQuants:
    """The quants of ``preset``'s community repos worth weighing (as the module says) where a quant of
    ``below_bytes`` did not fit and at most ``room_bytes`` of weights could (``plan.community.weights_room``).
    ``offline`` (None: ``HF_HUB_OFFLINE``): nothing is asked."""
    from clover_local.fetch import hub

    repos = tuple(c.repo for c in preset.community)
    offline = settings.hf_offline() if offline is None else offline
    if offline:
        unlisted = [c.repo for c in preset.community if not c.quants]
        note = (
            f"Offline: the community repos {', '.join(unlisted)} were not asked for a smaller quant (online, the "
            "plan lists them and reads the headers of their smaller quants, a few MB each)."
        )
        return CommunityQuants(
            repos, from_listings(preset, below_bytes, room_bytes), (note,) if unlisted else ()
        )
    quants: list[CommunityQuant] = []
    notes: list[str] = []
    for at, community in enumerate(preset.community):
        repo = community.repo
        try:
            listing = hub.list_repo(repo, "main", timeout_s=timeout_s, retries=0)
        except HubUnreachableError as exc:
            # The Hub is down: the other repos would cost a timeout each for the same answer. What their pages
            # list (the preset keeps it) is weighed as offline.
            notes.append(
                f"The community repos were not asked for a smaller quant: {exc.what.rstrip('.')}. The sizes "
                "their pages list are weighed instead."
            )
            unasked = preset.community[at:]
            quants.extend(from_listings(replace(preset, community=unasked), below_bytes, room_bytes))
            break
        except DownloadError as exc:
            notes.append(f"The community repo {repo} could not be listed: {exc.what.rstrip('.')}.")
            continue
        files = {e.path: e.size for e in listing.entries}
        try:
            as_repo = preset_for_repo(preset, repo, files)
        except DownloadError as exc:  # no GGUF in it
            notes.append(f"The community repo {repo} offers no quant: {exc.what.rstrip('.')}.")
            continue
        listed = {q: spec.fallback_bytes for q, spec in as_repo.quants.items()}
        for quant in shortlist(listed, below_bytes, room_bytes):
            pattern = as_repo.quants[quant].pattern
            shards = tuple(select_quant_files(repo, files, pattern))
            try:
                desc, source = _described(as_repo, quant, shards, timeout_s)
            except GGUFError as exc:
                notes.append(
                    f"{quant} of {repo} is not offered: its header cannot be read ({exc.what.rstrip('.')})."
                )
                continue
            if (problem := load_problem(desc)) is not None:
                notes.append(f"{quant} of {repo} is not offered: {problem}.")
                continue
            quality = _quality(community.quants, quant, shards[0])
            quants.append(CommunityQuant(repo, quant, shards, desc, source, pattern, quality))
    return CommunityQuants(repos, tuple(quants), tuple(notes))


def _quality(listed: tuple[CommunityListing, ...], quant: str, path: str) -> str:
    """What the publisher says of this file's quality, as the preset keeps it (matched by name or pattern;
    a listing without a pattern is the repo's one model file)."""
    for e in listed:
        if (
            e.quant == quant
            or (e.pattern and quant_matches(path, e.pattern))
            or (e.pattern is None and len(listed) == 1)
        ):
            return e.quality
    return ""


def _described(
    as_repo: Preset, quant: str, shards: tuple[str, ...], timeout_s: float
) -> tuple[ModelDescription, str]:
    """The quant's header from the Hub (cached), else (the Hub did not answer) the base preset's shape at its
    listed size, with why. A header that is there but cannot be read raises :class:`GGUFError`: such a file
    is not offered (a fork's tensor type, a corrupt upload)."""
    from clover_local.fetch.remote_header import read_remote_header

    try:
        desc = read_remote_header(as_repo.repo, shards[0], offline=False, timeout_s=timeout_s, retries=0)
    except GGUFError:
        raise
    except CloverError as exc:
        listed = as_repo.quants[quant].fallback_bytes
        return describe_from_preset(as_repo, quant, listed), f"estimated from its listed size: {exc.what}"
    return desc, f"exact, from the GGUF header of {shards[0]} on the Hub"

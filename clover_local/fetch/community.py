"""Ask a preset's community GGUF repos (``[[community]]``) for smaller quants: each repo listed once, and the
GGUF headers of the few quants worth reading (``plan.community.shortlist``: smaller than the quant that did not
fit, no larger than what this machine could hold, best quality first) read with range requests, a few MB each,
and cached like the preset's own (``fetch.remote_header``). The answer is a value for the pure choice
(``plan.community.choose_community_quant``); nothing here raises for the Hub: a repo that cannot be asked
becomes a sentence, and offline nothing is asked (the sentence names the repos that would be).
"""

from __future__ import annotations

from clover_local import settings
from clover_local.errors import CloverError, DownloadError, HubUnreachableError
from clover_local.fetch.quants import select_quant_files
from clover_local.gguf.model import ModelDescription, describe_from_preset
from clover_local.plan.community import CommunityQuant, CommunityQuants, shortlist
from clover_local.presets import Preset

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
    """The quants of ``preset``'s community repos worth weighing where a quant of ``below_bytes`` did not fit
    and at most ``room_bytes`` of weights could (``plan.community.weights_room``), described from their
    headers. ``offline`` (None: ``HF_HUB_OFFLINE``): nothing is asked, and the notes say what would be."""
    from clover_local.fetch import hub
    from clover_local.fetch.repo_preset import preset_for_repo

    repos = tuple(c.repo for c in preset.community)
    offline = settings.hf_offline() if offline is None else offline
    if offline:
        return CommunityQuants(
            repos,
            notes=(
                f"Offline: the community repos {', '.join(repos)} were not asked for a smaller quant (online, "
                "the plan lists them and reads the headers of their smaller quants, a few MB each).",
            ),
        )
    quants: list[CommunityQuant] = []
    notes: list[str] = []
    for repo in repos:
        try:
            listing = hub.list_repo(repo, "main", timeout_s=timeout_s, retries=0)
        except HubUnreachableError as exc:
            notes.append(f"The community repos were not asked for a smaller quant: {exc.what.rstrip('.')}.")
            break  # the Hub is down: the other repos would cost a timeout each for the same answer
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
            shards = tuple(select_quant_files(repo, files, as_repo.quants[quant].pattern))
            desc, source = _described(as_repo, quant, shards, timeout_s)
            quants.append(CommunityQuant(repo, quant, shards, desc, source))
    return CommunityQuants(repos, tuple(quants), tuple(notes))


def _described(
    as_repo: Preset, quant: str, shards: tuple[str, ...], timeout_s: float
) -> tuple[ModelDescription, str]:
    """The quant's header from the Hub (cached), else the base preset's shape at its listed size, with why."""
    from clover_local.fetch.remote_header import read_remote_header

    try:
        desc = read_remote_header(as_repo.repo, shards[0], offline=False, timeout_s=timeout_s, retries=0)
    except CloverError as exc:
        listed = as_repo.quants[quant].fallback_bytes
        return describe_from_preset(as_repo, quant, listed), f"estimated from its listed size: {exc.what}"
    return desc, f"exact, from the GGUF header of {shards[0]} on the Hub"

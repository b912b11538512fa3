"""``clover-local models``: the GGUFs already in the Hugging Face cache (shared with the ``hf`` CLI)."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "models",
        help="list GGUF models in the Hugging Face cache, and unfinished downloads",
        description=(
            "List the GGUF models in the Hugging Face cache (HF_HUB_CACHE / HF_HOME), split files by their"
            " first shard, and downloads that were interrupted (run `clover-local download` to finish them)."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local import settings
    from clover_local.fetch.local import cached_ggufs, partial_downloads
    from clover_local.fetch.progress import format_bytes

    models = cached_ggufs()
    partials = partial_downloads()
    if args.json:
        payload = {
            "cache": str(settings.hf_cache_dir()),
            "models": [
                {
                    "repo": m.repo,
                    "quant": m.quant,
                    "file": m.filename,
                    "path": str(m.path),
                    "size_bytes": m.size_bytes,
                    "shards": m.n_shards,
                    "complete": m.complete,
                    "commit": m.commit,
                    "refs": list(m.refs),
                    "sidecars": [
                        {"kind": kind, "path": str(path), "size_bytes": size}
                        for kind, path, size in m.sidecars
                    ],
                }
                for m in models
            ],
            "partial_downloads": [{"repo": r, "file": str(p), "bytes": n} for r, p, n in partials],
        }
        print(json.dumps(payload, indent=2))
        return 0
    if not models and not partials:
        print(f"No GGUF models in the Hugging Face cache ({settings.hf_cache_dir()}).")
        print("Get one with `clover-local download`, or pass a .gguf path to the other commands.")
        return 0
    for m in models:
        shards = f", {m.n_shards} shards" if m.n_shards > 1 else ""
        state = "" if m.complete else "  (incomplete: run `clover-local download` to finish)"
        print(f"{m.repo}  {m.quant or '?'}  {format_bytes(m.size_bytes)}{shards}{state}\n    {m.path}")
        for kind, path, size in m.sidecars:
            print(f"    + {kind} sidecar, {format_bytes(size)}: {path.name}")
    for repo, path, n in partials:
        print(f"{repo}  unfinished download, {format_bytes(n)} so far: {path.name}")
    return 0

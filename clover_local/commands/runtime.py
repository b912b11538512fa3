"""``clover-local runtime``: list, install and remove upstream llama.cpp releases beside the pinned build."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clover_local.runtimes.installed import InstalledRuntime


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clover_local.runtimes.assets import BACKENDS

    parser = subparsers.add_parser(
        "runtime",
        help="list, install and remove llama.cpp releases beside the pinned build",
        description=(
            "Upstream llama.cpp releases installed side by side with the pinned build, one folder per release tag"
            " under CLOVER_RUNTIMES_DIR: the release's prebuilt archive for this OS, CPU and GPU (checked against"
            " the sha256 the release publishes), or a build of its source. A model whose architecture only a newer"
            " llama.cpp knows runs through such a runtime's llama-server."
        ),
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="installed runtimes and the pinned llama.cpp")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=run_list)
    install = verbs.add_parser(
        "install",
        help="install a llama.cpp release (default: the latest)",
        description=(
            "Download the release's prebuilt archive for this machine, verify its sha256, unpack it and keep that"
            " tag's llama-arch.cpp and arg.cpp beside llama-server; or build the release's source (--from-source,"
            " and when no archive fits). Progress goes to stderr; an interrupted download continues on the next run."
        ),
    )
    install.add_argument(
        "tag", nargs="?", default="latest", metavar="TAG", help="a release tag (b7000) or latest"
    )
    install.add_argument(
        "--backend", choices=(*BACKENDS, "cuda"), help="the GPU backend (default: chosen from this machine)"
    )
    install.add_argument("--from-source", action="store_true", help="build the release's source with CMake")
    install.add_argument("--force", action="store_true", help="install again even when the tag is installed")
    install.add_argument(
        "--allow-unverified",
        action="store_true",
        help="accept an archive the release publishes no sha256 digest for (its sha256 is recorded)",
    )
    install.add_argument("--jobs", type=int, metavar="N", help="parallel compile jobs of a source build")
    install.add_argument("--json", action="store_true", help="print the installed runtime as JSON")
    install.set_defaults(func=run_install)
    remove = verbs.add_parser("remove", help="remove an installed runtime")
    remove.add_argument("tag", metavar="TAG")
    remove.set_defaults(func=run_remove)


def run_list(args: argparse.Namespace) -> int:
    from clover_local import settings
    from clover_local.runtimes.installed import installed_runtimes, pinned_runtimes

    rows: list[dict[str, Any]] = [_row(rt) for rt in installed_runtimes()]
    # The llama.cpp this package pins: the embedded engine's, and the llama-server built from the same source.
    pinned = [{"tag": "pinned", **asdict(p)} for p in pinned_runtimes()]
    if args.json:
        out = {"runtimes_dir": str(settings.runtimes_dir()), "installed": rows, "pinned": pinned}
        print(json.dumps(out, indent=2))
        return 0
    if rows:
        for row in rows:
            print(f"{row['tag']:<9} {row['backend']:<8} {row['origin']:<8} {row['server']}")
    else:
        print(f"No llama.cpp runtime installed in {settings.runtimes_dir()}.")
        print("Install the latest release with `clover-local runtime install`.")
    for entry in pinned:
        print(
            f"{'pinned':<9} {entry['backend']:<8} {entry['origin']:<8} {entry['path']}  (llama.cpp {entry['commit']})"
        )
    return 0


def run_install(args: argparse.Namespace) -> int:
    from clover_local.commands.download import ProgressPrinter
    from clover_local.runtimes.install import install

    printer = ProgressPrinter(sys.stderr, as_json=False)

    def notify(message: str) -> None:
        printer.end()
        print(message, file=sys.stderr, flush=True)

    try:
        runtime = install(
            args.tag,
            backend=args.backend,
            from_source=args.from_source,
            force=args.force,
            allow_unverified=args.allow_unverified,
            progress=printer,
            notify=notify,
            jobs=args.jobs,
        )
    finally:
        printer.end()
    if args.json:
        print(json.dumps(_row(runtime), indent=2))
    else:
        print(f"{runtime.tag} {runtime.backend} {runtime.origin} {runtime.server}")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    from clover_local.runtimes.install import remove

    folder = remove(args.tag)
    print(f"Removed llama.cpp {args.tag} ({folder}).")
    return 0


def _row(rt: InstalledRuntime) -> dict[str, Any]:
    return {
        "tag": rt.tag,
        "backend": rt.backend,
        "origin": rt.origin,
        "path": str(rt.root),
        "server": str(rt.server),
        "asset": rt.asset,
        "sha256": rt.sha256,
        "installed": rt.installed,
    }

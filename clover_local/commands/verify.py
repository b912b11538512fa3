"""``clover-local verify``: hash a downloaded model against the Hub's sha256; move corrupt files aside.

clover-local verify                      # the default preset's quant
clover-local verify --repo org/name --quant Q8_0
clover-local verify ~/models/some.gguf   # a local file: checks it is a GGUF and prints its sha256
"""

from __future__ import annotations

import argparse
import json
import sys

from clover_local.commands.download import ProgressPrinter, add_model_arguments, model_target


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "verify",
        help="check a downloaded model's sha256 against the Hub (corrupt files are moved aside)",
        description=(
            "Hash every file of a downloaded model and compare with the sha256 the Hub lists (offline: the"
            " sha256 the cache recorded). A corrupt file is moved out of use and the command says what to do."
        ),
    )
    parser.add_argument("path", nargs="?", help="a local .gguf file to check instead of a cached model")
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.fetch.download import verify_files

    printer = ProgressPrinter(sys.stderr, as_json=args.json)
    try:
        if args.path:
            checks = verify_files(args.path, progress=printer)
        else:
            target = model_target(args, force=True)  # verifying hashes needs no architecture check
            model = str(target.packaged) if target.packaged else target.repo
            checks = verify_files(
                model,
                target.pattern,
                revision=args.revision,
                filename=args.file or target.filename,
                progress=printer,
            )
    finally:
        printer.end()
    if args.json:
        rows = [
            {
                "file": c.filename,
                "path": str(c.path),
                "size": c.size,
                "sha256": c.actual_sha256,
                "expected_sha256": c.expected_sha256,
                "ok": c.ok,
                "draft": c.draft,
            }
            for c in checks
        ]
        print(json.dumps(rows, indent=2))
    else:
        for c in checks:
            how = "matches the Hub" if c.expected_sha256 else "no sha256 to compare with"
            role = f" [{c.draft} sidecar]" if c.draft else ""
            print(f"ok  {c.filename}{role}  sha256 {c.actual_sha256}  ({how})")
    return 0

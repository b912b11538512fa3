"""``clover-local download``: fetch a model's GGUF into the Hugging Face cache (resumable, verified).

clover-local download                          # the default preset, quant chosen for this machine
clover-local download smollm2-135m             # a model in any form every command reads (model_ref):
clover-local download bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0   # as llama.cpp's -hf,
clover-local download hf.co/bartowski/SmolLM2-135M-Instruct-GGUF  # as Ollama
clover-local download --quant Q8_0
clover-local download --repo org/name --quant Q4_K_M
clover-local download --repo org/name          # the file `llama-server -hf org/name` loads
clover-local download --repo org/name --file Model-Q4_K_M-00001-of-00002.gguf
clover-local download --no-draft               # without the drafter sidecars (mtp-, dflash-...) for the quant
clover-local download --force                  # even when the llama.cpp here cannot load its architecture
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from clover_local.errors import ArchitectureError, CloverError, UsageError
from clover_local.fetch.progress import DownloadProgress, status_line
from clover_local.presets import Preset, load_preset


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "download",
        help="download the model's GGUF from Hugging Face (resumable, sha256-verified)",
        description=(
            "Download a GGUF into the Hugging Face cache (shared with the `hf` CLI). An interrupted download"
            " continues where it stopped; every file is checked against the Hub's sha256."
        ),
    )
    from clover_local.commands.options import add_model_argument

    add_model_argument(parser)
    add_model_arguments(parser)
    parser.add_argument(
        "--no-draft",
        action="store_true",
        help="skip the drafter sidecars (mtp-, dflash-, dspark-, eagle3- files) the repo has for the quant",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="download even when the llama.cpp here cannot load the model's architecture (checked first)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON (progress as JSON lines on stderr)"
    )
    parser.set_defaults(func=run)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments that say which model: shared by ``download`` and ``verify``."""
    parser.add_argument("--preset", help="preset name (default: CLOVER_PRESET or clover-35b-a3b)")
    parser.add_argument("--quant", help="Q4_K_M, Q8_0, ... or auto (the planner picks for this machine)")
    parser.add_argument("--repo", help="a Hugging Face repo (org/name) instead of the preset's")
    parser.add_argument("--file", help="one file of the repo (a split GGUF: any shard; all are fetched)")
    parser.add_argument("--revision", help="branch, tag or commit (default: main)")


def run(args: argparse.Namespace) -> int:
    from clover_local.arch_support import check_to_dict
    from clover_local.commands.options import apply_model_ref
    from clover_local.fetch.download import check_architectures, fetch_resolved, resolve_quant_files
    from clover_local.fetch.progress import format_bytes

    apply_model_ref(args)
    if getattr(args, "model", None):
        from clover_local.model_files import checked_gguf

        local = checked_gguf(Path(args.model))
        _report(args, {"path": str(local), "source": "local file"}, f"Ready: {local} (a local file)")
        return 0
    target = model_target(args, force=args.force)
    if target.packaged is not None:
        _report(args, {"path": str(target.packaged), "source": "python package"}, f"Ready: {target.packaged}")
        return 0
    if target.note:
        print(target.note, file=sys.stderr)
    resolved = resolve_quant_files(
        target.repo,
        target.pattern,
        args.revision,
        filename=args.file or target.filename,
        drafts=not args.no_draft,
    )
    resolved = check_architectures(resolved, force=args.force)  # before any byte of the files
    for note in resolved.notes:
        print(f"note: {note}", file=sys.stderr)
    printer = ProgressPrinter(sys.stderr, as_json=args.json)
    try:
        path = fetch_resolved(resolved, progress=printer)
    except KeyboardInterrupt:
        printer.end()
        print("Interrupted: what was fetched is kept; run the same command to continue.", file=sys.stderr)
        return 130
    printer.end()
    result = {
        "repo": resolved.repo,
        "quant": target.quant,
        "revision": resolved.revision,
        "commit": resolved.commit,
        "path": str(path),
        "total_bytes": resolved.total_bytes,
        "files": [
            {
                "path": f.path,
                "size": f.size,
                "sha256": f.sha256,
                "local_path": str(resolved.local_path(i)),
                "draft": f.draft,
            }
            for i, f in enumerate(resolved.files)
        ],
        "sidecars": {kind: str(p) for kind, p in resolved.sidecars.items()},
        "architecture": check_to_dict(resolved.architecture) if resolved.architecture is not None else None,
        "notes": list(resolved.notes),
    }
    n_model = len(resolved.model_files)
    shards = f" ({n_model} files)" if n_model > 1 else ""
    lines = [
        f"Ready: {resolved.repo} {target.quant}{shards}, {format_bytes(resolved.total_bytes)}",
        str(path),
    ]
    if resolved.architecture is not None:
        lines[0] += f"; runs with {resolved.architecture.runs_with}"
    lines += [f"  {kind} sidecar: {p}" for kind, p in resolved.sidecars.items()]
    _report(args, result, "\n".join(lines))
    return 0


@dataclass(frozen=True)
class ModelTarget:
    """What the arguments name: a repo and a file-name pattern, or a packaged model file."""

    repo: str
    pattern: str | None
    """Matched in the repo's file names; None when ``--file`` names the file."""
    quant: str
    """The quant (or file) as the person said it, for messages."""
    note: str = ""
    """Why this quant (when ``auto`` was resolved)."""
    packaged: Path | None = None
    """The model file assembled from a Python package (test presets), when there is one."""
    filename: str | None = None
    """The file to fetch when no quant was named (the one ``-hf REPO`` loads), as ``--file`` would name it."""


def model_target(args: argparse.Namespace, *, force: bool = False) -> ModelTarget:
    """Turn ``--preset/--quant/--repo/--file`` into a repo and a pattern (asking the planner for ``auto``;
    ``force``: plan it even when the llama.cpp here cannot load its architecture)."""
    from clover_local.fetch.local import packaged_model

    if args.repo:
        if args.file:
            return ModelTarget(args.repo, None, args.file)
        if not args.quant or args.quant == "auto":
            return _hf_default(args.repo, args.revision)
        return ModelTarget(args.repo, args.quant, args.quant)
    preset = load_preset(args.preset)
    if args.file:
        return ModelTarget(preset.repo, None, args.file)
    quant, note = args.quant or preset.default_quant, ""
    if quant == "auto":
        quant, note = auto_quant(preset, force=force)
    elif quant not in preset.quants:
        known = ", ".join(preset.quants)
        raise UsageError(f"Preset {preset.name} has no quant {quant!r}.", f"Its quants: {known} (or auto).")
    packaged = packaged_model(preset)
    return ModelTarget(preset.repo, preset.quants[quant].pattern, quant, note, packaged)


def _hf_default(repo: str, revision: str | None) -> ModelTarget:
    """``--repo`` without a quant: the file ``llama-server -hf REPO`` loads (Q4_K_M, else Q8_0, else the first
    model GGUF), named as ``--file``."""
    from clover_local.fetch import hub
    from clover_local.fetch.quants import select_quant_files

    listing = hub.list_repo(repo, revision or "main")
    first = select_quant_files(repo, [e.path for e in listing.entries], None)[0]
    note = f"File {first}: the one `llama-server -hf {repo}` loads (Q4_K_M, else Q8_0, else the first GGUF)."
    return ModelTarget(repo, None, first, note, filename=first)


def auto_quant(preset: Preset, *, force: bool = False) -> tuple[str, str]:
    """The quant the planner picks for this machine (weighing each quant with exact sizes from its GGUF
    header on the Hub where it can be read), with lines saying so and where the sizes came from; the
    preset's fallback when the planner cannot decide. An architecture the llama.cpp here cannot load is
    refused here already (unless ``force``): no quant of it would do."""
    from clover_local.fetch.download import fallback_quant

    try:
        from clover_local.launch import LaunchRequest, decide_launch

        # The plan of the launch that will run it: budgeted for its runner (llama-server for a model only
        # llama-server runs), so the quant fetched is the one `clover-local plan` shows and `run` loads.
        plan = decide_launch(LaunchRequest(preset, force=force)).plan
        sizes = "".join(f"\n  sizes of {quant}: {text}" for quant, text in plan.size_sources)
        return (
            plan.quant,
            f"Quant {plan.quant}: the planner's choice for this machine (`clover-local plan` says why).{sizes}",
        )
    except ArchitectureError:
        raise
    except (ImportError, CloverError) as exc:
        quant = fallback_quant(preset)
        return quant, f"Quant {quant}: the preset's default (the planner could not decide: {exc})."


class StatusLine:
    """A line rewritten in place on a terminal; elsewhere (or when it holds several lines) written out."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._width = 0

    def show(self, line: str) -> None:
        if self.tty and "\n" not in line:
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self.end()
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


class ProgressPrinter(StatusLine):
    """Progress on stderr: one line rewritten in place on a terminal, a line every few seconds in a
    log, or JSON lines with ``--json``."""

    def __init__(self, stream: TextIO, *, as_json: bool, log_every_s: float = 5.0) -> None:
        super().__init__(stream)
        self._json = as_json
        self._log_every = log_every_s
        self._last = float("-inf")
        self._phase = ""

    def __call__(self, p: DownloadProgress) -> None:
        now = time.monotonic()
        new_phase, self._phase = p.phase != self._phase, p.phase
        if self._json:
            if new_phase or now - self._last >= 1.0:
                self._last = now
                print(json.dumps({"event": "progress", **asdict(p)}), file=self.stream, flush=True)
        elif self.tty or new_phase or now - self._last >= self._log_every:
            self._last = now
            self.show(status_line(p))


def _report(args: argparse.Namespace, result: dict[str, object], text: str) -> None:
    print(json.dumps(result, indent=2) if args.json else text)

"""Which model architectures the llama.cpp here can load, which of them decode by diffusion, and the check that
refuses a GGUF whose ``general.architecture`` is not among them, before its bytes are downloaded or loaded.

Both tables come from llama.cpp's own ``src/llama-arch.cpp``: ``LLM_ARCH_NAMES`` (every architecture the loader
accepts) and ``llm_arch_is_diffusion`` (those ``llama_model_is_diffusion`` reports), read by
:func:`parse_llama_arch`:

- the embedded engine's (llama-cpp-python): generated into the package, :mod:`clover_local.llama_arch_table`
  (``scripts/gen_arch_table.py``, from the pinned llama-cpp-python sdist), so it is there on every install;
- a built llama-server's: the ``llama-arch.cpp`` that ``scripts/build-llama-server`` keeps beside the binaries,
  with ``build-info.json`` naming its version; it may be a newer llama.cpp than the embedded one;
- each installed upstream runtime's (:mod:`clover_local.runtimes.installed`): the ``llama-arch.cpp`` of its tag,
  kept in its folder;
- the latest upstream release's, when an architecture is known to none of those and looking is allowed (not
  offline): read before any model byte (:mod:`clover_local.runtimes.upstream`), to name the release to install;
- when that release cannot be asked (offline, unreachable), the release a preset says first loads the
  architecture (its ``[runtime] min_release``, :class:`ReleaseHint`): the plan still names what to install.

:func:`check_architecture` decides; :func:`require_supported` turns a "no" into the one error people see.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from clover_local import settings
from clover_local.errors import ArchitectureError, PresetError, UpstreamError
from clover_local.presets import load_preset_file, preset_files
from clover_local.runtimes.installed import installed_runtimes

Runner = Literal["llama.cpp", "llama-server", "diffusion"]
"""What runs an architecture: ``llama.cpp`` (left to right, in the embedded engine or llama-server),
``llama-server`` (only the built llama-server's newer llama.cpp knows it), ``diffusion`` (denoising, in the
embedded engine's diffusion decoder)."""
Action = Literal["download", "load"]
"""What a refusal stops, for its message."""

_NAME_ROW = re.compile(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}")
_DIFFUSION_FN = re.compile(r"bool\s+llm_arch_is_diffusion\s*\([^)]*\)\s*\{(.*?)\n\}", re.DOTALL)
_CASE = re.compile(r"case\s+(LLM_ARCH_\w+)\s*:")
PACKAGED_SOURCE = "clover_local/llama_arch_table.py"


@dataclass(frozen=True)
class ArchTable:
    """What one llama.cpp can load."""

    names: frozenset[str]
    diffusion: frozenset[str]
    llama_cpp_python: str
    """The llama-cpp-python release whose vendored llama.cpp this is (``unknown`` when not recorded)."""
    llama_cpp_commit: str
    source: str
    """Where the table was read (a file), for messages."""

    @property
    def label(self) -> str:
        return f"llama-cpp-python {self.llama_cpp_python}, llama.cpp {self.llama_cpp_commit}"


@dataclass(frozen=True)
class RuntimeTable:
    """What one installed upstream runtime can load, and its llama-server."""

    tag: str
    server: Path
    label: str
    table: ArchTable


@dataclass(frozen=True)
class ReleaseHint:
    """A preset's word that upstream llama.cpp loads ``arch`` from release ``release`` on (its ``[runtime]
    min_release``): what to install when the latest release cannot be asked."""

    arch: str
    release: str
    preset: str
    """The preset that says so, for messages."""


@dataclass(frozen=True)
class ArchSupport:
    """The tables that apply here: the embedded engine's, a built llama-server's when there is one, every
    installed runtime's (newest first), and whether the latest upstream release may be asked."""

    embedded: ArchTable
    server: ArchTable | None = None
    installed: str | None = None
    """The llama-cpp-python version installed here; None when it is not installed."""
    runtimes: tuple[RuntimeTable, ...] = ()
    look_upstream: bool = False
    """Ask the latest upstream release (:mod:`clover_local.runtimes.upstream`) about an architecture nothing
    here knows; False offline (then only a release's source read before answers)."""
    hints: tuple[ReleaseHint, ...] = ()
    """The presets' minimum releases, for architectures nothing here knows (:func:`preset_release_hints`)."""
    latest: tuple[str, ArchTable] | str | None = None
    """The latest release's tag and table, or why it was not read (:func:`latest_release`); None: not asked
    yet (then :func:`check_architecture` asks it when nothing here knows an architecture)."""

    def hint(self, arch: str) -> ReleaseHint | None:
        """The preset's minimum release for ``arch``, if a preset names one."""
        return next((h for h in self.hints if h.arch == arch), None)


@dataclass(frozen=True)
class ArchCheck:
    """The answer for one GGUF: ``plan --json`` prints it as ``architecture``."""

    name: str | None
    """Its ``general.architecture``; None when the header could not be read."""
    supported: bool
    runner: Runner | None
    """What runs it (:data:`Runner`); None when nothing here can."""
    why: str
    runtime: str | None = None
    """The installed runtime (its release tag) whose llama-server runs it; None: the pinned llama.cpp's."""
    server_path: str | None = None
    """That runtime's ``llama-server``."""
    server_source: str | None = None
    """How it was found, for messages (``runtime b12060``)."""
    install: str | None = None
    """A release that knows the architecture, to install (``supported`` is False until it is)."""
    install_command: str | None = None
    """The one command that installs it."""
    min_release: str | None = None
    """The first release that loads it, as its preset says (``[runtime] min_release``); None: not said."""

    @property
    def runs_with(self) -> str:
        """Which llama.cpp runs it, or what to install, in a few words (plan screens and ``plan``)."""
        if self.runtime is not None:
            return f"llama.cpp {self.runtime} (installed runtime, its llama-server)"
        if self.install is not None:
            needs = f"{self.min_release} or newer" if self.min_release else self.install
            return f"needs llama.cpp {needs}: install it with `{self.install_command}`"
        if self.runner == "llama-server":
            return "the built llama-server"
        if self.supported:
            return "the pinned llama.cpp (embedded engine or the built llama-server)"
        return "no llama.cpp here knows it"


def check_to_dict(check: ArchCheck) -> dict[str, object]:
    """``check`` for ``--json`` (``plan``, ``download``): its fields and ``runs_with``."""
    return {**asdict(check), "runs_with": check.runs_with}


def parse_llama_arch(
    text: str,
    source: str = "llama-arch.cpp",
    llama_cpp_python: str = "unknown",
    llama_cpp_commit: str = "unknown",
) -> ArchTable:
    """The architecture names and the diffusion subset from the text of ``src/llama-arch.cpp``."""
    rows = dict(_NAME_ROW.findall(text))
    names = {name for enum, name in rows.items() if enum != "LLM_ARCH_UNKNOWN"}
    body = _DIFFUSION_FN.search(text)
    diffusion = {rows[e] for e in _CASE.findall(body.group(1)) if e in rows} if body else set()
    if not names:
        raise ValueError(f"{source}: no LLM_ARCH_NAMES table found")
    return ArchTable(frozenset(names), frozenset(diffusion), llama_cpp_python, llama_cpp_commit, source)


def packaged_table() -> ArchTable:
    """The pinned llama-cpp-python's table, generated into the package."""
    from clover_local import llama_arch_table as t

    names, diffusion = frozenset(t.ARCHITECTURES), frozenset(t.DIFFUSION)
    return ArchTable(names, diffusion, t.LLAMA_CPP_PYTHON, t.LLAMA_CPP_COMMIT, PACKAGED_SOURCE)


def server_table(install_dir: Path | None = None) -> ArchTable | None:
    """The table of the llama.cpp ``scripts/build-llama-server`` built, from the ``llama-arch.cpp`` it keeps beside
    the binaries; None when none is there (llama-server not built) or it cannot be read."""
    folder = install_dir or settings.llama_server_dir()
    try:
        return _read_server_table(str(folder), (folder / "llama-arch.cpp").stat().st_mtime_ns)
    except (OSError, ValueError):
        return None


@lru_cache(maxsize=4)
def _read_server_table(folder: str, mtime_ns: int) -> ArchTable:
    path = Path(folder) / "llama-arch.cpp"
    try:
        info = json.loads((Path(folder) / "build-info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = {}
    info = info if isinstance(info, dict) else {}
    text = path.read_text(encoding="utf-8", errors="replace")
    version, commit = str(info.get("version", "unknown")), str(info.get("llama_cpp_commit", "unknown"))
    return parse_llama_arch(text, str(path), version, commit)


@lru_cache(maxsize=1)
def installed_llama_cpp_python() -> str | None:
    """The llama-cpp-python version installed here (read from its metadata: llama_cpp is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None


def runtime_tables(folder: Path | None = None) -> tuple[RuntimeTable, ...]:
    """The table of every installed runtime, newest release first; one whose ``llama-arch.cpp`` cannot be read
    is left out (it can load nothing that is known)."""
    out: list[RuntimeTable] = []
    for rt in installed_runtimes(folder):
        try:
            table = _read_arch_file(str(rt.arch_source), rt.arch_source.stat().st_mtime_ns, rt.tag)
        except (OSError, ValueError):
            continue
        out.append(RuntimeTable(rt.tag, rt.server, rt.label, table))
    return tuple(out)


@lru_cache(maxsize=16)
def _read_arch_file(path: str, mtime_ns: int, tag: str) -> ArchTable:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return parse_llama_arch(text, path, "none", tag)


def installed_support(install_dir: Path | None = None, *, offline: bool | None = None) -> ArchSupport:
    """The tables that apply on this install. The embedded engine's is the packaged one, unless another
    llama-cpp-python is installed and llama-server was built from that same version (then its kept table).
    ``offline`` (None: ``HF_HUB_OFFLINE``): the latest upstream release is not asked."""
    packaged = packaged_table()
    server = server_table(install_dir)
    installed = installed_llama_cpp_python()
    embedded = packaged
    if (
        server is not None
        and installed not in (None, packaged.llama_cpp_python)
        and server.llama_cpp_python == installed
    ):
        embedded = server
    offline = settings.hf_offline() if offline is None else offline
    return ArchSupport(
        embedded, server, installed, runtime_tables(), look_upstream=not offline, hints=preset_release_hints()
    )


def preset_release_hints() -> tuple[ReleaseHint, ...]:
    """Every preset's ``[runtime] min_release`` for its architecture (user presets over shipped ones); a preset
    that cannot be read says nothing here (loading it says why)."""
    hints: list[ReleaseHint] = []
    for path in preset_files().values():
        try:
            preset = load_preset_file(path)
        except PresetError:
            continue
        if preset.min_release is not None:
            hints.append(ReleaseHint(preset.architecture.arch, preset.min_release, preset.name))
    return tuple(hints)


def is_diffusion_arch(arch: str, support: ArchSupport | None = None) -> bool:
    """True for architectures llama.cpp runs as diffusion models (``llama_model_is_diffusion``): as the
    embedded engine's table of ``support`` says, else the pinned llama.cpp's (packaged: reading a header asks
    no file or process for it)."""
    table = support.embedded if support is not None else packaged_table()
    return arch in table.diffusion


def check_architecture(arch: str, support: ArchSupport | None = None) -> ArchCheck:
    """Can a llama.cpp here load a GGUF whose ``general.architecture`` is ``arch``, and what runs it? The one
    decision, in this order:

    1. the embedded engine, when the pinned llama.cpp knows it (diffusion models decode only there);
    2. the newest installed runtime whose llama.cpp knows it: its llama-server runs it;
    3. the built llama-server, when it is a newer llama.cpp that knows it;
    4. when looking is allowed, the latest upstream release's ``llama-arch.cpp``: when it knows it, the answer
       names that release and the command that installs it (``supported`` stays False until then);
    5. else, when the latest release could not be asked and a preset names the first release that loads it
       (:class:`ReleaseHint`), that release and its install command;
    6. else no: ``why`` says what was asked."""
    support = support or installed_support()
    embedded, server = support.embedded, support.server
    if arch in embedded.names:
        if arch in embedded.diffusion:
            said = f"{embedded.label} loads {arch!r}, a diffusion model: the diffusion engine runs it"
            return ArchCheck(arch, True, "diffusion", said)
        return ArchCheck(arch, True, "llama.cpp", f"{embedded.label} loads {arch!r}")
    for rt in support.runtimes:
        if arch in rt.table.names and arch not in rt.table.diffusion:
            said = (
                f"the pinned {embedded.label} does not know {arch!r}; the installed runtime {rt.label} does: "
                "its llama-server runs it"
            )
            source = f"runtime {rt.tag}"
            return ArchCheck(
                arch, True, "llama-server", said, rt.tag, server_path=str(rt.server), server_source=source
            )
    if server is not None and arch in server.names and arch not in server.diffusion:
        said = (
            f"only the built llama-server ({server.label}) loads {arch!r}, not the embedded {embedded.label}: "
            "it runs in llama-server"
        )
        return ArchCheck(arch, True, "llama-server", said)
    why = (
        f"the llama.cpp here cannot load the architecture {arch!r} ({embedded.label}: not among its "
        f"{len(embedded.names)} architectures"
    )
    if server is not None and server.label != embedded.label:
        known = (
            "a diffusion model, which llama-server cannot decode"
            if arch in server.names
            else "nor does it know it"
        )
        why += f"; the built llama-server, {server.label}: {known}"
    if support.runtimes:
        why += f"; nor do the installed runtimes ({', '.join(rt.tag for rt in support.runtimes)})"
    if support.installed not in (None, embedded.llama_cpp_python):
        why += f"; the table is llama-cpp-python {embedded.llama_cpp_python}'s, but {support.installed} is installed"
    latest = support.latest if support.latest is not None else latest_release(support.look_upstream)
    hint = support.hint(arch)

    def install(release: str, said: str) -> ArchCheck:
        command = f"clover-local runtime install {release}"
        minimum = hint.release if hint is not None else None
        return ArchCheck(
            arch, False, None, said, install=release, install_command=command, min_release=minimum
        )

    if isinstance(latest, str):
        if hint is None:
            return ArchCheck(arch, False, None, f"{why}; {latest})")
        return install(
            hint.release,
            f"{why}; {latest}); the preset {hint.preset} says llama.cpp {hint.release} or newer loads it, and "
            "none is installed",
        )
    tag, table = latest
    if arch in table.names and arch not in table.diffusion:
        return install(tag, f"{why}); the latest llama.cpp release, {tag}, loads it, and it is not installed")
    return ArchCheck(arch, False, None, f"{why}; nor does the latest llama.cpp release, {tag})")


def knows_locally(arch: str, support: ArchSupport) -> bool:
    """Whether a llama.cpp here (the embedded engine's, an installed runtime's, the built llama-server's)
    answers for ``arch`` without the latest release being asked."""
    others = [*(rt.table for rt in support.runtimes), *([support.server] if support.server else [])]
    return arch in support.embedded.names or any(arch in t.names and arch not in t.diffusion for t in others)


def latest_release(look: bool) -> tuple[str, ArchTable] | str:
    """The latest release's tag and table, or why there is none (for the ``why`` of a refusal); ``look``
    False: only a release's source read before answers."""
    from clover_local.runtimes.upstream import latest_arch_source

    try:
        latest = latest_arch_source(offline=not look)
        return latest.tag, _parse_upstream(latest.tag, latest.text, latest.source)
    except UpstreamError as exc:
        if exc.offline:  # its sentence says the same again
            return "offline, so the latest llama.cpp release was not asked"
        return f"the latest llama.cpp release was not asked: {exc.what.rstrip('.')}"
    except ValueError as exc:
        return f"the latest llama.cpp release's llama-arch.cpp could not be read: {exc}"


@lru_cache(maxsize=4)
def _parse_upstream(tag: str, text: str, source: str) -> ArchTable:
    return parse_llama_arch(text, source, "none", tag)


def unreadable(reason: str) -> ArchCheck:
    """The answer when the GGUF header could not be read: unchecked is not allowed."""
    return ArchCheck(
        None, False, None, f"its GGUF header could not be read ({reason}), so its architecture is unknown"
    )


def require_supported(
    check: ArchCheck, subject: str, action: Action, *, force: bool = False, installable_ok: bool = False
) -> ArchCheck:
    """``check`` when the architecture can be loaded (or ``force`` says to go on anyway, or ``installable_ok``
    and a release that loads it can be installed: planning needs no runtime yet); otherwise the one refusal
    people see: what the file is, the llama.cpp here, and the ways on."""
    if check.supported or force or (installable_ok and check.install is not None):
        return check
    done, verb = ("downloaded", "download") if action == "download" else ("loaded", "try loading")
    if check.name is None:
        fix = f"Check that it is a GGUF made for llama.cpp, or add --force to {verb} it anyway."
    elif check.install is not None:
        fix = (
            f"Install llama.cpp {check.install}, which loads {check.name!r}: `{check.install_command}`; then "
            f"{action} again. Or add --force to {verb} it anyway."
        )
    else:
        fix = (
            f"When a llama.cpp release knows {check.name!r}, `clover-local runtime install <tag>` installs it "
            f"(`clover-local plan` names the release once the latest one does); or add --force to {verb} it "
            "anyway."
        )
    raise ArchitectureError(f"{subject}: {check.why}. Nothing was {done}.", fix)


def sidecar_skipped(kind: str, filename: str, check: ArchCheck, action: Action) -> str:
    """The note for a drafter sidecar whose architecture cannot be loaded: it is left out, the model is not."""
    without = "downloads" if action == "download" else "runs"
    return f"The {kind} sidecar {filename} is skipped: {check.why}. The model {without} without it."

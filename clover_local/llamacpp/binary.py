"""Which ``llama-server`` to run and what it can do.

Upstream llama.cpp renames and adds flags often, and people run builds older or newer than the vendored one,
so nothing here assumes a version: the binary's own ``--version``, ``--help`` and ``--list-devices`` say what
it supports. Results are cached per binary path, size and mtime (in memory and in the cache dir).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clover_local import settings
from clover_local.errors import ServerError
from clover_local.runtimes.installed import read_json_dict
from clover_local.user_files import write_atomically

_HELP_SPEC_WIDTH = 37
"""llama.cpp's help puts the flag names and value hint in the first 40 columns (``common_arg::to_string``)."""
_VERSION_RES = (
    # ``version: 0.5.0-dev (build 1, commit 0c1e57098)`` (newer) and ``version: 6895 (4341dc8bc)`` (older).
    re.compile(r"version:\s*(?P<name>[^\s(]+)\s*\(build\s+(?P<build>\d+),\s*commit\s+(?P<commit>\w+)\)"),
    re.compile(r"version:\s*(?P<build>\d+)\s*\((?P<commit>\w+)\)"),
)
_JINJA_DEFAULT_ON_RE = re.compile(r"^--jinja, --no-jinja .*\(default: enabled\)", re.MULTILINE)
_CACHE_FORMAT = 4
"""Bump when what is probed or parsed changes, so cached results are probed again."""
_DEVICE_RE = re.compile(r"^\s*([A-Za-z]+)\d*:\s")
_DEVICE_BACKENDS = {"mtl": "metal", "hip": "rocm"}
"""Device names whose backend is called otherwise (``CUDA0`` -> ``cuda``, ``MTL0`` -> ``metal``)."""


@dataclass(frozen=True)
class ServerBinary:
    """A ``llama-server`` executable and how it was found."""

    path: Path
    source: str
    """``CLOVER_LLAMA_SERVER``, ``configured``, ``built`` (by scripts/build-llama-server) or ``PATH``."""
    subcommand: tuple[str, ...] = ()
    """``("serve",)`` for llama.cpp's single ``llama`` command (its installer, winget, Homebrew), which runs the
    same server as ``llama serve``; empty for ``llama-server`` itself."""

    @property
    def command(self) -> list[str]:
        """What starts the server, before its flags: ``[path]``, or ``[path, "serve"]``."""
        return [str(self.path), *self.subcommand]

    def sibling(self, name: str) -> Path | None:
        """A tool built alongside it (``llama-fit-params``, ``llama-bench``), else one on PATH."""
        return find_tool(name, beside=self.path.parent)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_tool(*names: str, beside: Path | None = None) -> Path | None:
    """The first of ``names`` in ``beside`` (default: where ``scripts/build-llama-server`` installs), else the
    first on ``PATH``; None when there is none."""
    folder = beside or settings.llama_server_dir()
    for name in names:
        if _executable(folder / name):
            return folder / name
    for name in names:
        if found := shutil.which(name):
            return Path(found)
    return None


@dataclass(frozen=True)
class FlagSpec:
    names: tuple[str, ...]
    value_hint: str
    """Empty for switches (``--jinja``); ``N``, ``TYPE``, ``[on|off|auto]``... for flags that take a value."""

    @property
    def takes_value(self) -> bool:
        return bool(self.value_hint)

    @property
    def choices(self) -> tuple[str, ...]:
        """The allowed values when the hint lists them (``[on|off|auto]``, ``[none|ngram-mod|...]``)."""
        hint = self.value_hint.strip("[]<>{}")
        if "|" in hint and " " not in hint:
            return tuple(hint.split("|"))
        if "," in hint and " " not in hint and hint.islower():
            return tuple(hint.split(","))
        return ()


@dataclass(frozen=True)
class Capabilities:
    """What one ``llama-server`` binary reports about itself."""

    version: str
    """As ``--version`` prints it, e.g. ``b0-0c1e57098``, or ``unknown``."""
    build_number: int | None
    commit: str | None
    flags: dict[str, FlagSpec] = field(default_factory=dict)
    """Every flag name (short and long) -> its spec."""
    devices: tuple[str, ...] = ()
    """Device lines from ``--list-devices`` (``CUDA0: NVIDIA ... (24 GiB)``); empty on CPU-only builds."""
    backends: tuple[str, ...] = ("cpu",)
    builtin_templates: tuple[str, ...] = ()
    """Chat template names ``--chat-template`` knows without Jinja (``gemma``, ``chatml``...)."""
    jinja_by_default: bool = False
    """Jinja is on unless ``--no-jinja``; then ``--chat-template NAME`` is read as a Jinja template text."""

    def supports(self, flag: str) -> bool:
        return flag in self.flags

    def spec(self, flag: str) -> FlagSpec | None:
        return self.flags.get(flag)


_memory_cache: dict[str, Capabilities] = {}


def find_llama_server(configured: str | os.PathLike[str] | None = None) -> ServerBinary | None:
    """The ``llama-server`` to use: ``CLOVER_LLAMA_SERVER``, then a configured path, then the one built by
    ``scripts/build-llama-server``, then ``PATH``. None when there is none.

    A path named explicitly (environment or configuration) that is not an executable is an error, not a
    silent fallback, so a typo is not hidden behind another binary."""
    explicit = [("CLOVER_LLAMA_SERVER", settings.llama_server_path_override()), ("configured", configured)]
    for source, value in explicit:
        if not value:
            continue
        path = Path(value).expanduser()
        if path.is_dir():
            path = path / "llama-server"
        if not _executable(path):
            raise ServerError(
                f"The llama-server named by {source} ({value}) is not an executable file.",
                "Fix the path, or unset it to use a built or PATH llama-server.",
            )
        return ServerBinary(path.resolve(), source)
    built = settings.llama_server_dir() / "llama-server"
    if _executable(built):
        return ServerBinary(built, "built")
    on_path = shutil.which("llama-server")
    if on_path:
        return ServerBinary(Path(on_path).resolve(), "PATH")
    return unified_llama()


def unified_llama() -> ServerBinary | None:
    """llama.cpp's single ``llama`` command on PATH (``llama serve`` is llama-server), when no ``llama-server`` is:
    what its installer, winget and Homebrew put there. Another program called ``llama`` (llama-stack's CLI...) is
    not taken: ``llama serve --help`` must list llama-server's options."""
    found = shutil.which("llama")
    if not found:
        return None
    binary = ServerBinary(Path(found).resolve(), "PATH (llama serve)", ("serve",))
    try:
        caps = capabilities(binary.path, binary.subcommand)
    except ServerError:
        return None
    return binary if caps.supports("--port") and caps.supports("--model") else None


def capabilities(binary: Path, subcommand: tuple[str, ...] = ()) -> Capabilities:
    """Version, flags and devices of a binary (run as ``binary *subcommand``); cached per path + size + mtime."""
    try:
        st = binary.stat()
    except OSError as exc:
        raise ServerError(f"Cannot read llama-server at {binary}: {exc.strerror}.") from None
    key = f"{_CACHE_FORMAT}|{binary.resolve()}|{' '.join(subcommand)}|{st.st_size}|{st.st_mtime_ns}"
    if key not in _memory_cache:
        disk_cache = settings.cache_dir() / "llama-server-capabilities.json"
        disk = read_json_dict(disk_cache) or {}
        caps = _caps_from_json(disk.get(key))
        if caps is None:
            caps = _probe(binary, subcommand)
            disk[key] = asdict(caps)
            with contextlib.suppress(OSError):  # a cache that cannot be written only costs a re-probe
                write_atomically(disk_cache, json.dumps(disk).encode())
        _memory_cache[key] = caps
    return _memory_cache[key]


def _run(binary: Path, *args: str) -> str:
    try:
        proc = subprocess.run(
            [str(binary), *args],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(
            f"Running {binary} {' '.join(args)} failed: {exc}.",
            "Check that it is a llama-server built for this machine (scripts/build-llama-server builds one).",
        ) from None
    return proc.stdout + "\n" + proc.stderr


def _probe(binary: Path, subcommand: tuple[str, ...] = ()) -> Capabilities:
    version_text = _run(binary, *subcommand, "--version")
    help_text = _run(binary, *subcommand, "--help")
    flags = parse_help(help_text)
    if not flags:
        raise ServerError(
            f"{binary} --help listed no flags; it does not look like llama-server.",
            "Point CLOVER_LLAMA_SERVER at a llama-server binary.",
        )
    devices: tuple[str, ...] = ()
    if "--list-devices" in flags:
        devices = parse_devices(_run(binary, *subcommand, "--list-devices"))
    version, build_number, commit = parse_version(version_text)
    return Capabilities(
        version=version,
        build_number=build_number,
        commit=commit,
        flags=flags,
        devices=devices,
        backends=backends_from_devices(devices),
        builtin_templates=parse_builtin_templates(help_text),
        jinja_by_default=bool(_JINJA_DEFAULT_ON_RE.search(help_text)),
    )


_ARG_OPTION = re.compile(
    r"common_arg\(\s*\{([^}]*)\}(?:\s*,\s*\{([^}]*)\})?\s*,(.*?)\[\]\s*\(([^)]*)\)", re.DOTALL
)
"""One option of ``common/arg.cpp``: ``common_arg({names}[, {negated names}], [value hint,] help, [](params[, value])``."""
_ARG_LITERAL = re.compile(r'^\s*"([^"]*)"')


def capabilities_from_arg_cpp(text: str, version: str) -> Capabilities:
    """What a llama-server accepts, read from the ``common/arg.cpp`` it was built from (kept beside a runtime):
    for when its ``--help`` cannot be asked. An option takes a value when its handler takes one; its hint is the
    literal before the help (``N``, ``[on|off|auto]``), ``VALUE`` when the source computes it. Every tool's
    options are there, not only the server's: a flag is dropped only when that llama.cpp has no such option."""
    flags: dict[str, FlagSpec] = {}
    for names, negated, middle, handler in _ARG_OPTION.findall(text):
        # (common_params & params, const std::string & value); a negatable pair's handler takes a bool instead
        takes = "," in handler and not negated
        literal = _ARG_LITERAL.match(middle)
        hint = ""
        if takes:
            short = literal is not None and " " not in literal.group(1) and len(literal.group(1)) <= 40
            hint = literal.group(1) if short and literal is not None else "VALUE"
        for group, group_hint in ((names, hint), (negated, "")):
            found = tuple(re.findall(r'"(-[^"]+)"', group))
            for name in found:
                flags.setdefault(name, FlagSpec(found, group_hint))
    if not flags:
        raise ServerError(f"No options found in the arg.cpp of llama.cpp {version}.")
    return Capabilities(version=version, build_number=None, commit=None, flags=flags)


def parse_version(text: str) -> tuple[str, int | None, str | None]:
    """(version as shown, build number, commit) from ``--version``; ``("unknown", None, None)`` if unreadable."""
    for pattern in _VERSION_RES:
        m = pattern.search(text)
        if m:
            build = int(m.group("build"))
            commit = m.group("commit") if m.group("commit") != "unknown" else None
            name = m.groupdict().get("name")
            shown = f"{name} (build {build}, commit {commit or 'unknown'})" if name else f"b{build}-{commit}"
            return shown, build, commit
    return "unknown", None, None


def parse_help(text: str) -> dict[str, FlagSpec]:
    """Flag name -> spec, from llama.cpp's ``--help`` layout (names and hint in the first 40 columns, the help
    text after them and on the lines indented 40). A flag whose help says it "has been removed" (upstream keeps
    ``--draft-max`` listed that way, and refuses it) is not one the binary takes: it is left out."""
    flags: dict[str, FlagSpec] = {}
    for names, hint, help_text in _help_entries(text):
        if _REMOVED in help_text.lower():
            continue
        spec = FlagSpec(names, hint)
        for name in names:
            flags.setdefault(name, spec)
    return flags


_REMOVED = "has been removed"


def _help_entries(text: str) -> list[tuple[tuple[str, ...], str, str]]:
    """(names, value hint, help text) of each option of a ``--help`` text."""
    entries: list[tuple[tuple[str, ...], str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(" " * 40) and entries:
            entries[-1][2].append(line.strip())  # the help text's next line
            continue
        if not line.startswith("-") or line.startswith("---"):
            continue
        spec_text = line[:_HELP_SPEC_WIDTH] if line[_HELP_SPEC_WIDTH:40] == "   " else line
        tokens = spec_text.split()
        names: list[str] = []
        i = 0
        while i < len(tokens) and tokens[i].startswith("-"):
            names.append(tokens[i].rstrip(","))
            i += 1
            if not tokens[i - 1].endswith(","):
                break
        if names:
            rest = line[40:].strip() if line[_HELP_SPEC_WIDTH:40] == "   " else ""
            entries.append((tuple(names), " ".join(tokens[i:]), [rest]))
    return [(names, hint, " ".join(lines)) for names, hint, lines in entries]


def parse_builtin_templates(text: str) -> tuple[str, ...]:
    """The names listed under "list of built-in templates:" in ``--chat-template``'s help."""
    names: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "list of built-in templates:" not in line:
            continue
        for follow in lines[i + 1 :]:
            if not follow.startswith(" " * 10) or not follow.strip():
                break
            names += [n.strip() for n in follow.split(",") if n.strip()]
        break
    return tuple(names)


def parse_devices(text: str) -> tuple[str, ...]:
    """Device lines printed by ``--list-devices`` (after ``Available devices:``)."""
    lines = text.splitlines()
    out: list[str] = []
    started = False
    for line in lines:
        if line.strip().lower().startswith("available devices"):
            started = True
            continue
        if started and _DEVICE_RE.match(line):
            out.append(line.strip())
    return tuple(out)


def backends_from_devices(devices: tuple[str, ...]) -> tuple[str, ...]:
    """``cpu`` plus one backend name per kind of device (``CUDA0`` -> ``cuda``)."""
    found: list[str] = []
    for line in devices:
        m = _DEVICE_RE.match(line)
        if not m:
            continue
        backend = _DEVICE_BACKENDS.get(m.group(1).lower(), m.group(1).lower())
        if backend not in found:
            found.append(backend)
    return (*found, "cpu")


def _caps_from_json(raw: Any) -> Capabilities | None:
    """Capabilities as the disk cache keeps them (:func:`dataclasses.asdict`); None when they are not that."""
    try:
        flags = {
            name: FlagSpec(tuple(spec["names"]), str(spec["value_hint"]))
            for name, spec in raw["flags"].items()
        }
        listed = {key: tuple(raw[key]) for key in ("devices", "backends", "builtin_templates")}
        return Capabilities(**{**raw, **listed, "flags": flags})
    except (KeyError, TypeError, ValueError, AttributeError):
        return None

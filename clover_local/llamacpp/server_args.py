"""Fit a plan's ``llama-server`` argv to the binary at hand.

The plan speaks the vendored llama.cpp's flags (``clover_local.plan.llama_args.llama_server_args``). An older
or newer upstream build may lack some: each one is translated to an equivalent the binary has
(``--n-cpu-moe`` -> ``--override-tensor``, ``--spec-ngram-mod-n-max`` -> ``--draft-max``, a valued ``-fa on``
-> the old switch ``-fa``) or dropped, and every change is reported so it can be shown as a warning.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from clover_local.gguf.names import FFN_EXPS_REGEX
from clover_local.llamacpp.binary import Capabilities
from clover_local.plan.reasons import Notice
from clover_local.plan.threads import binding_flags, cores_in_mask

_FLAG_RE = re.compile(r"^--?[A-Za-z]")
_RENAMES: dict[str, tuple[str, ...]] = {
    "--spec-ngram-mod-n-max": ("--spec-draft-n-max", "--draft-max"),
    "--spec-ngram-mod-n-min": ("--spec-draft-n-min", "--draft-min"),
    "-fa": ("--flash-attn",),
    "--flash-attn": ("-fa",),
    "-ncmoe": ("--n-cpu-moe",),
    "--n-cpu-moe": ("-ncmoe",),
    "--no-webui": ("--no-ui",),
    "--no-ui": ("--no-webui",),
}
_SPEC_FALLBACK_TYPES = ("ngram-mod", "ngram-map-k", "ngram-simple")


PRINTED_HOST = "127.0.0.1"
PRINTED_PORT = 8080
"""Where a printed ``llama-server`` command listens (``clover-local command``, the launch screen): said in the
command, since llama-server's own default port is not the same in every release (8080, later 9931)."""


@dataclass(frozen=True)
class AdaptedArgs:
    argv: list[str]
    warnings: tuple[Notice, ...]


def split_flags(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """``[-c, 4096, --jinja]`` -> ``[("-c", "4096"), ("--jinja", None)]``; a bare leading token (the
    binary's own path) is skipped. A token is a value when it does not look like a flag (``-1`` is a value)."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    tokens = list(argv)
    if tokens and not tokens[0].startswith("-"):
        i = 1
    while i < len(tokens):
        flag = tokens[i]
        value: str | None = None
        if i + 1 < len(tokens) and not _FLAG_RE.match(tokens[i + 1]):
            value = tokens[i + 1]
            i += 1
        pairs.append((flag, value))
        i += 1
    return pairs


def n_cpu_moe_override(n_layers: int) -> str:
    """``--override-tensor`` value keeping the routed experts of the first ``n_layers`` layers on the CPU."""
    layers = "|".join(str(i) for i in range(n_layers))
    return rf"blk\.({layers}){FFN_EXPS_REGEX}=CPU"


def fit_argv(argv: Sequence[str], caps: Capabilities, *, repack_safe: bool) -> AdaptedArgs:
    """The one fitting of a plan's argv to a llama-server: the CPU's repacking rule (``engine.repack``: the
    plan may describe another machine) and the flags this binary has (:func:`adapt_args`). The launch fits it
    when decided, from the facts; ``start_llama_server`` fits it only for a binary that could not be asked
    then."""
    from clover_local.engine.repack import with_repack_rule

    return adapt_args(with_repack_rule(argv, repack_safe), caps)


def adapt_args(argv: Sequence[str], caps: Capabilities) -> AdaptedArgs:
    """The argv this binary accepts, with a warning per flag translated or dropped."""
    out: list[str] = []
    warnings: list[Notice] = []
    pairs = split_flags(argv)
    spec_dropped = False
    for flag, value in pairs:
        if flag.startswith("--spec-") and spec_dropped:
            continue
        if flag == "--spec-type" and value is not None:
            chosen = _spec_type(value, caps)
            if chosen is None:
                spec_dropped = True
                said = f"({caps.version}) has no self-speculative decoding (--spec-type {value}): running without it."
                warnings.append(Notice("flag-dropped", f"This llama-server {said}"))
                continue
            if chosen != value:
                said = f"--spec-type {value} is not in this llama-server; using {chosen}."
                warnings.append(Notice("flag-renamed", said))
            out += [flag, chosen]
            continue
        if flag in ("--n-cpu-moe", "-ncmoe") and not _has(caps, flag, "--n-cpu-moe", "-ncmoe"):
            out += _translate_n_cpu_moe(value, caps, warnings)
            continue
        target = _supported_name(flag, caps)
        if target is None:
            shown = f"{flag} {value}" if value is not None else flag
            said = f"This llama-server ({caps.version}) does not accept {shown}: dropped."
            warnings.append(Notice("flag-dropped", said))
            continue
        if target != flag:
            warnings.append(Notice("flag-renamed", f"{flag} is called {target} in this llama-server."))
        out += _with_value(target, value, caps, warnings)
    _builtin_template_without_jinja(out, caps)
    return AdaptedArgs(out, tuple(warnings))


def _builtin_template_without_jinja(argv: list[str], caps: Capabilities) -> None:
    """A built-in template name (``--chat-template gemma``) is only read as a name with Jinja off; with Jinja on
    (the default in newer builds) llama-server would use the word itself as the template text."""
    flags = dict(split_flags(argv))
    name = flags.get("--chat-template")
    if (
        name in caps.builtin_templates
        and caps.jinja_by_default
        and caps.supports("--no-jinja")
        and "--jinja" not in flags
        and "--no-jinja" not in flags
    ):
        argv.append("--no-jinja")


def _has(caps: Capabilities, *names: str) -> bool:
    return any(caps.supports(n) for n in names)


def _supported_name(flag: str, caps: Capabilities) -> str | None:
    if caps.supports(flag):
        return flag
    for alt in _RENAMES.get(flag, ()):
        if caps.supports(alt):
            return alt
    return None


def _with_value(flag: str, value: str | None, caps: Capabilities, warnings: list[Notice]) -> list[str]:
    spec = caps.spec(flag)
    if value is None or spec is None:
        return [flag] if value is None else [flag, value]
    if not spec.takes_value:
        # An old switch (e.g. ``-fa`` before it took on|off|auto): on -> the switch, anything else -> nothing.
        if value.lower() in ("on", "1", "true", "enabled"):
            return [flag]
        if value.lower() not in ("off", "0", "false", "disabled", "auto"):
            said = f"{flag} takes no value in this llama-server: {value!r} dropped."
            warnings.append(Notice("flag-dropped", said))
        return []
    if spec.choices and value not in spec.choices:
        said = f"{flag} {value} is not one of {'|'.join(spec.choices)} here: dropped."
        warnings.append(Notice("flag-dropped", said))
        return []
    return [flag, value]


def _spec_type(wanted: str, caps: Capabilities) -> str | None:
    spec = caps.spec("--spec-type")
    if spec is None:
        return None
    choices = spec.choices
    if not choices or wanted in choices:
        return wanted
    for alt in _SPEC_FALLBACK_TYPES:
        if alt in choices:
            return alt
    return None


def _translate_n_cpu_moe(value: str | None, caps: Capabilities, warnings: list[Notice]) -> list[str]:
    try:
        n = int(value or "0")
    except ValueError:
        n = 0
    if n <= 0:
        return []
    for ot in ("--override-tensor", "-ot"):
        if caps.supports(ot):
            said = f"--n-cpu-moe {n} is not in this llama-server: using {ot} for the same layers."
            warnings.append(Notice("flag-renamed", said))
            return [ot, n_cpu_moe_override(n)]
    said = (
        f"This llama-server has neither --n-cpu-moe nor --override-tensor: the experts of the first {n} "
        "layers cannot be kept in RAM, and the model may not fit."
    )
    warnings.append(Notice("flag-dropped", said))
    return []


def printed_endpoint(argv: Sequence[str]) -> list[str]:
    """The argv with the host and port a printed command listens on (:data:`PRINTED_PORT`), unless set."""
    flags = dict(split_flags(argv))
    return list(argv) if "--port" in flags else with_endpoint(argv, host=PRINTED_HOST, port=PRINTED_PORT)


def with_endpoint(
    argv: Sequence[str],
    *,
    host: str,
    port: int,
    api_key_file: str | None = None,
) -> list[str]:
    """The argv with ``--host``/``--port`` (and a key file) set as asked, replacing any already there.
    A key itself travels in the ``LLAMA_API_KEY`` environment variable, not argv, where ``ps`` shows it."""
    key_file = ["--api-key-file", api_key_file] if api_key_file else []
    added = ["--host", host, "--port", str(port), *key_file]
    return _replacing(argv, {"--host", "--port", "--api-key", "--api-key-file"}, added)


_THREAD_FLAGS = {"-t": "threads", "--threads": "threads", "-tb": "batch", "--threads-batch": "batch"}


def threads_in(argv: Sequence[str]) -> int | None:
    """The decode threads an argv asks for (``-t``/``--threads``), None when it leaves them to llama-server."""
    for flag, value in split_flags(argv):
        if _THREAD_FLAGS.get(flag) == "threads" and value is not None and value.lstrip("-").isdigit():
            return int(value)
    return None


_BINDING_FLAGS = {"-C", "--cpu-mask", "--cpu-strict", "-Cb", "--cpu-mask-batch", "--cpu-strict-batch"}


def with_threads(argv: Sequence[str], threads: int) -> list[str]:
    """The argv with ``threads`` for decoding and batches (``-t``, ``-tb``), replacing any already there: what a
    child started again for another load runs with (``llamacpp.load_follow``). Where the argv keeps its threads
    on the machine's cores (``--cpu-mask``, ``plan.threads.binding_flags``), they are bound one to a core again
    only while they take every core."""
    cores: tuple[int, ...] = ()
    for flag, value in split_flags(argv):
        if flag in ("-C", "--cpu-mask") and value is not None:
            cores = cores_in_mask(value)
    dropped = set(_THREAD_FLAGS) | (_BINDING_FLAGS if cores else set())
    added = ["-t", str(threads), "-tb", str(threads), *binding_flags(threads, cores)]
    return _replacing(argv, dropped, added)


def with_slot_save(argv: Sequence[str], directory: str) -> list[str]:
    """The argv with ``--slot-save-path`` set to ``directory`` (replacing any): the child can then save each
    slot's state to a file there and restore it (``POST /slots/ID?action=save|restore``), which a relaunch uses
    to keep the conversations it holds."""
    return _replacing(argv, {"--slot-save-path"}, ["--slot-save-path", directory])


def _replacing(argv: Sequence[str], dropped: set[str], added: list[str]) -> list[str]:
    """The argv (a leading binary path kept) without the ``dropped`` flags and their values, then ``added``."""
    out: list[str] = [argv[0]] if argv and not argv[0].startswith("-") else []
    for flag, value in split_flags(argv):
        if flag not in dropped:
            out += [flag] if value is None else [flag, value]
    return [*out, *added]

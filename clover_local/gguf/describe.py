"""Turn raw GGUF headers (one per shard) into the :class:`ModelDescription` the planner reads.

The keys are llama.cpp's (``{arch}.block_count``, ``{arch}.attention.head_count_kv``...); where llama.cpp
falls back to a default when a key is missing, so does this module, with the same value (for example a
full-attention layer every 4th layer for Qwen3.5 MoE, a global layer every 6th for Gemma 3).
"""

from __future__ import annotations

import math
from typing import Any

import gguf

from clover_local.errors import GGUFError
from clover_local.gguf.model import DiffusionHeader, ModelDescription, TensorEntry
from clover_local.gguf.parse import RawHeader, StringArray
from clover_local.presets import Architecture

# llama.cpp's defaults when the GGUF does not say (src/models/<arch>.cpp at the vendored commit).
_FULL_ATTENTION_INTERVAL_DEFAULT = {"qwen35moe": 4, "qwen35": 4, "qwen3next": 4}
GATED_DELTANET_INTERVAL = 4
"""The Gated DeltaNet hybrids' default (qwen3next, qwen35, qwen35moe: ``hparams.full_attn_interval``), for an
architecture named otherwise whose header holds that family's keys (Clover's ``clover_moe``, say)."""
_GATED_DELTANET_KEYS = (
    "ssm.state_size",
    "ssm.inner_size",
    "ssm.group_count",
    "ssm.time_step_rank",
    "ssm.conv_kernel",
)
_SWA_PATTERN_DEFAULT = {"gemma3": 6, "gemma2": 2, "gemma3n": 5}
MAX_LAYERS = 512
"""llama.cpp's LLAMA_MAX_LAYERS: a header saying more is damaged (and would feed per-layer lists)."""
MAX_COUNT_VALUE = 1 << 40
"""Largest count or size an integer key may hold (a trillion: far past any model's)."""
_RECURRENT_STATE_DTYPE_BYTES = 4
"""llama.cpp keeps recurrent state (conv and SSM/delta-net state) in F32."""


def describe(headers: list[RawHeader], file_bytes: int, source: str) -> ModelDescription:
    """One description from the headers of all shards (metadata from the first, tensors from all)."""
    kv = headers[0].kv
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError(f"{source}: the GGUF does not name its architecture (general.architecture).")
    tensors = tuple(
        TensorEntry.classify(t.name, t.n_bytes, t.ggml_type.name) for h in headers for t in h.tensors
    )
    names = {t.name for t in tensors}
    keys = _ArchKeys(kv, arch, source)

    # llama.cpp: n_layer() = block_count - nextn_predict_layers; MTP blocks come after the trunk.
    n_nextn = keys.integer("nextn_predict_layers", 0)
    n_layers = keys.integer("block_count") - n_nextn
    if not 0 < n_layers <= MAX_LAYERS:
        raise GGUFError(
            f"{source}: {arch}.block_count says {n_layers + n_nextn} layers; llama.cpp loads 1 to {MAX_LAYERS}.",
            "The file is damaged or not a model llama.cpp can run.",
        )
    n_embd = keys.integer("embedding_length")
    n_head = keys.integer("attention.head_count", 0)
    head_dim = keys.integer("attention.key_length", n_embd // n_head if n_head else 0)
    expert_bytes = sum(t.n_bytes for t in tensors if t.is_expert)
    weight_bytes = sum(t.n_bytes for t in tensors) or 1
    n_expert_shared = keys.integer("expert_shared_count", 0)
    if not n_expert_shared and any("_shexp." in n for n in names):
        n_expert_shared = 1  # Qwen MoE: one shared expert, present as tensors but not as a key

    architecture = Architecture(
        arch=arch,
        n_layers=n_layers,
        n_head_kv=keys.integer("attention.head_count_kv", n_head),
        n_head=n_head,
        head_dim=head_dim,
        n_embd=n_embd,
        n_vocab=_vocab_size(kv, keys),
        n_ctx_train=keys.integer("context_length"),
        full_attention_interval=_full_attention_interval(keys, arch),
        n_expert=keys.integer("expert_count", 0),
        n_expert_used=keys.integer("expert_used_count", 0),
        n_expert_shared=n_expert_shared,
        expert_ffn=keys.integer("expert_feed_forward_length", 0),
        recurrent_state_bytes=_recurrent_state_bytes(keys, n_layers + n_nextn, arch),
        expert_weight_fraction=round(expert_bytes / weight_bytes, 4),
        sliding_window=keys.integer("attention.sliding_window", 0),
        sliding_window_pattern=_swa_pattern(keys, arch),
        n_nextn_layers=n_nextn,
    )
    for field in ("n_layers", "n_embd", "n_ctx_train", "n_head_kv", "head_dim", "n_vocab"):
        if getattr(architecture, field) <= 0:
            raise GGUFError(f"{source}: the GGUF header gives no usable {field} for architecture {arch!r}.")
    template = kv.get("tokenizer.chat_template")
    name = kv.get("general.name")
    return ModelDescription(
        architecture=architecture,
        file_bytes=file_bytes,
        quant=quant_name(kv.get("general.file_type")),
        tensors=tensors,
        chat_template=template if isinstance(template, str) and template else None,
        source=source,
        diffusion=_diffusion_header(kv, arch),
        name=name.strip() if isinstance(name, str) and name.strip() else None,
    )


def _diffusion_header(kv: dict[str, Any], arch: str) -> DiffusionHeader | None:
    """The diffusion keys, for architectures the installed llama.cpp runs as diffusion models."""
    from clover_local.arch_support import is_diffusion_arch

    if not is_diffusion_arch(arch):
        return None
    shift = kv.get("diffusion.shift_logits")
    mask = kv.get("tokenizer.ggml.mask_token_id")
    return DiffusionHeader(
        shift_logits=shift if isinstance(shift, bool) else True,
        shift_logits_in_header=isinstance(shift, bool),
        mask_token_id=mask if isinstance(mask, int) and not isinstance(mask, bool) else None,
    )


def quant_name(file_type: Any) -> str | None:
    """``general.file_type`` as people say it (15 -> ``Q4_K_M``); None when absent or unknown."""
    if not isinstance(file_type, int):
        return None
    try:
        name = gguf.LlamaFileType(file_type & ~gguf.LlamaFileType.GUESSED).name
    except ValueError:
        return None
    return "F32" if name == "ALL_F32" else name.removeprefix("MOSTLY_")


class _ArchKeys:
    """Typed access to ``{arch}.*`` keys, with errors naming the key."""

    def __init__(self, kv: dict[str, Any], arch: str, source: str) -> None:
        self.kv, self.arch, self.source = kv, arch, source

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.kv

    def raw(self, key: str) -> Any:
        return self.kv.get(f"{self.arch}.{key}")

    def integer(self, key: str, default: int | None = None) -> int:
        """The key's value; for a per-layer array, the largest (memory must fit the largest layer)."""
        value = self.raw(key)
        if value is None:
            if default is None:
                raise GGUFError(f"{self.source}: the GGUF header lacks {self.arch}.{key}.")
            return default
        if isinstance(value, list):
            value = max(value, default=0)
        return self._count(key, value)

    def per_layer(self, key: str, n_layers: int) -> list[int] | None:
        value = self.raw(key)
        if isinstance(value, list) and len(value) >= n_layers:
            return [self._count(key, v) for v in value[:n_layers]]
        return None

    def _count(self, key: str, value: Any) -> int:
        """``value`` as a count or size: a whole number from 0 to :data:`MAX_COUNT_VALUE` (a hostile or broken
        header may hold inf, NaN, -1 or 10**30 where a count belongs), else :class:`GGUFError` naming the key."""
        name = f"{self.arch}.{key}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GGUFError(f"{self.source}: {name} is {str(value)[:80]!r}, not a number.")
        if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
            raise GGUFError(f"{self.source}: {name} is {value!r}, not a whole number.")
        if not 0 <= value <= MAX_COUNT_VALUE:
            raise GGUFError(f"{self.source}: {name} is {int(value)}, out of range for a count (0 to 2^40).")
        return int(value)


def _full_attention_interval(keys: _ArchKeys, arch: str) -> int | None:
    """Hybrid models: every Nth layer attends, the others are recurrent. None: all layers attend."""
    value = keys.integer("full_attention_interval", 0)
    if not value and keys.has("ssm.state_size"):
        value = _default_interval(keys, arch)
    return value or None


def _default_interval(keys: _ArchKeys, arch: str) -> int:
    """The attention interval llama.cpp assumes when the header gives none: by name for the families the pinned
    llama.cpp knows, else by what the header holds (a Gated DeltaNet hybrid: its ``ssm.*`` keys with one KV
    head count for every layer, not Mamba-2's per-layer list); 0 for none."""
    if arch in _FULL_ATTENTION_INTERVAL_DEFAULT:
        return _FULL_ATTENTION_INTERVAL_DEFAULT[arch]
    per_layer = isinstance(keys.raw("attention.head_count_kv"), list)
    if all(keys.has(k) for k in _GATED_DELTANET_KEYS) and not per_layer:
        return GATED_DELTANET_INTERVAL
    return 0


def _vocab_size(kv: dict[str, Any], keys: _ArchKeys) -> int:
    tokens = kv.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list | StringArray) and tokens:
        return len(tokens)
    return keys.integer("vocab_size", 0)


def _swa_pattern(keys: _ArchKeys, arch: str) -> int:
    """Every Nth layer is global attention; 0 when the model has no sliding window."""
    if not keys.integer("attention.sliding_window", 0):
        return 0
    value = keys.raw("attention.sliding_window_pattern")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, list) and False in value:
        return value.index(False) + 1  # per-layer flags (True = sliding): the first global layer
    return _SWA_PATTERN_DEFAULT.get(arch, 0)


def _recurrent_state_bytes(keys: _ArchKeys, n_layers: int, arch: str) -> int:
    """Per-sequence recurrent state of all recurrent layers, as llama.cpp sizes it.

    llama.cpp (``llama_hparams::n_embd_r``/``n_embd_s``, Mamba-style and Gated DeltaNet layers): conv state
    ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)`` plus SSM state ``d_state * d_inner`` values per
    recurrent layer, in F32. Recurrent layers are those flagged in ``attention.recurrent_layers``, else all but
    every ``full_attention_interval``-th, else those with no KV heads, else (pure SSM) all.
    """
    d_state = keys.integer("ssm.state_size", 0)
    d_inner = keys.integer("ssm.inner_size", 0)
    if not d_state or not d_inner:
        return 0
    d_conv = keys.integer("ssm.conv_kernel", 0)
    n_group = keys.integer("ssm.group_count", 0)
    per_layer = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
    n_main = n_layers - keys.integer("nextn_predict_layers", 0)
    flags = keys.raw("attention.recurrent_layers")
    kv_heads = keys.per_layer("attention.head_count_kv", n_main)
    interval = keys.integer("full_attention_interval", 0) or _default_interval(keys, arch)
    if isinstance(flags, list):
        n_recurrent = sum(bool(f) for f in flags[:n_main])
    elif interval:
        n_recurrent = sum(1 for i in range(n_main) if (i + 1) % interval != 0)
    elif kv_heads is not None:
        n_recurrent = sum(1 for h in kv_heads if h == 0)
    else:
        n_recurrent = n_main
    return n_recurrent * per_layer * _RECURRENT_STATE_DTYPE_BYTES

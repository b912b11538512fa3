"""A full-size, random-weight GGUF with Clover-35B-A3B-Preview's real shape (qwen35moe: 40 layers, every 4th full
attention, 256 experts top-8 plus a shared one, vocabulary 248,320) in a Q4_K_M-like mix, streamed to disk in
seconds; under the architecture name ``qwen35moe`` (the pinned llama.cpp loads it) or ``clover_moe`` (only a
runtime that knows Clover does: what the product runs Clover with).

:func:`write_clover_header` writes only the header of such a file in another quant mix (:data:`MIXES`: Q3_K_M,
IQ3_XXS, ...), whole or split into shards, as a sparse file of the full size: a GGUF repo on the Hub stand-in
whose headers say what the real files would hold, at no disk cost. Its data is zeros: never load it.

Its text means nothing, but llama.cpp loads it, places it and decodes it exactly as it would the real file: the
same tensors, types and sizes, so memory and speed measured on it hold for the real model. Quantized tensors are
one random pattern of *valid* blocks (small finite scales) tiled to each tensor's size; small F32 tensors (norms,
router, recurrent-layer scalars) are real random values. The output head's rows for control tokens are zero, so
greedy decoding never stops early at an end-of-generation token.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import gguf

N_VOCAB = 248_320
N_LAYER = 40
N_EMBD = 2048
N_HEAD, N_HEAD_KV, HEAD_DIM = 16, 2, 256
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 256, 8, 512, 512
FULL_ATTENTION_INTERVAL = 4
SSM_STATE, SSM_K_HEADS, SSM_V_HEADS, SSM_CONV = 128, 16, 32, 4
N_ROT = 64
N_CTX_TRAIN = 131_072

Q4_K, Q6_K, F32 = "Q4_K", "Q6_K", "F32"
_BLOCK = {Q4_K: (256, 144), Q6_K: (256, 210)}
"""Weights and bytes per block of the types whose random blocks :func:`write_clover_shaped` writes."""
ARCHITECTURES = ("qwen35moe", "clover_moe")


@dataclass(frozen=True)
class QuantMix:
    """Which ggml type each kind of tensor gets in one quant (llama.cpp's mixes, roughly: for sizes)."""

    file_type: str
    """``gguf.LlamaFileType`` member, without ``MOSTLY_``."""
    experts: str
    """Routed experts' gate and up."""
    down: str
    """Experts' (and the shared expert's) down projection ..."""
    down_more: str
    """... in the layers llama.cpp gives more bits (``use_more_bits``)."""
    dense: str
    """Attention, Gated DeltaNet and shared-expert weights."""
    attn_v: str
    embd: str
    output: str


MIXES: dict[str, QuantMix] = {
    "Q8_0": QuantMix("Q8_0", "Q8_0", "Q8_0", "Q8_0", "Q8_0", "Q8_0", "Q8_0", "Q8_0"),
    "Q4_K_M": QuantMix("Q4_K_M", Q4_K, Q4_K, Q6_K, Q4_K, Q6_K, Q4_K, Q6_K),
    "Q4_K_S": QuantMix("Q4_K_S", Q4_K, Q4_K, "Q5_K", Q4_K, "Q5_K", Q4_K, Q6_K),
    "Q3_K_XL": QuantMix("Q3_K_M", "Q3_K", Q4_K, "Q5_K", "Q5_K", Q6_K, Q4_K, Q6_K),
    "Q3_K_M": QuantMix("Q3_K_M", "Q3_K", Q4_K, "Q5_K", Q4_K, "Q5_K", "Q3_K", Q6_K),
    "IQ3_XXS": QuantMix("IQ3_XXS", "IQ3_XXS", "Q3_K", Q4_K, Q4_K, Q4_K, "Q3_K", "Q5_K"),
    "Q2_K_XL": QuantMix("Q2_K", "Q2_K", "Q3_K", Q4_K, Q4_K, "Q5_K", "Q3_K", Q6_K),
}
"""Mixes :func:`write_clover_header` writes, by the quant name files carry (``UD-Q3_K_XL`` carries ``Q3_K_XL``)."""
_PATTERN_BYTES = 8 * 1024 * 1024 - 7 * 144 * 210  # not a multiple of a row: tiled rows differ
_CHUNK = 64 * 1024 * 1024


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    """numpy order (rows last-but-one): the reverse of ggml's ``ne``."""
    kind: str

    @property
    def n_weights(self) -> int:
        return int(np.prod(self.shape))

    @property
    def n_bytes(self) -> int:
        if self.kind == F32:
            return self.n_weights * 4
        per, size = _block(self.kind)
        return self.n_weights // per * size


def _block(kind: str) -> tuple[int, int]:
    """Weights and bytes per block of a ggml type."""
    import gguf

    per, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    return int(per), int(size)


def _more_bits(il: int) -> bool:
    """llama.cpp's Q4_K_M rule (``use_more_bits``): the first and last eighth of the layers and every third."""
    return il < N_LAYER // 8 or il >= 7 * N_LAYER // 8 or (il - N_LAYER // 8) % 3 == 2


def tensor_plan(mix: QuantMix = MIXES["Q4_K_M"]) -> list[TensorPlan]:
    """Every tensor of the Clover-shaped model, in file order, with the type ``mix`` gives it (Q4_K_M's)."""
    e, m = N_EMBD, mix
    out = [
        TensorPlan("token_embd.weight", (N_VOCAB, e), m.embd),
        TensorPlan("output_norm.weight", (e,), F32),
        TensorPlan("output.weight", (N_VOCAB, e), m.output),
    ]
    key_dim, value_dim = SSM_STATE * SSM_K_HEADS, SSM_STATE * SSM_V_HEADS
    for il in range(N_LAYER):
        p = f"blk.{il}."
        out += [
            TensorPlan(p + "attn_norm.weight", (e,), F32),
            TensorPlan(p + "post_attention_norm.weight", (e,), F32),
        ]
        if (il + 1) % FULL_ATTENTION_INTERVAL == 0:
            out += [
                TensorPlan(p + "attn_q.weight", (2 * N_HEAD * HEAD_DIM, e), m.dense),
                TensorPlan(p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, e), m.dense),
                TensorPlan(p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, e), m.attn_v),
                TensorPlan(p + "attn_output.weight", (e, N_HEAD * HEAD_DIM), m.dense),
                TensorPlan(p + "attn_q_norm.weight", (HEAD_DIM,), F32),
                TensorPlan(p + "attn_k_norm.weight", (HEAD_DIM,), F32),
            ]
        else:
            conv_dim = 2 * key_dim + value_dim
            out += [
                TensorPlan(p + "attn_qkv.weight", (conv_dim, e), m.dense),
                TensorPlan(p + "attn_gate.weight", (value_dim, e), m.dense),
                TensorPlan(p + "ssm_conv1d.weight", (conv_dim, SSM_CONV), F32),
                TensorPlan(p + "ssm_dt.bias", (SSM_V_HEADS,), F32),
                TensorPlan(p + "ssm_a", (SSM_V_HEADS,), F32),
                TensorPlan(p + "ssm_beta.weight", (SSM_V_HEADS, e), F32),
                TensorPlan(p + "ssm_alpha.weight", (SSM_V_HEADS, e), F32),
                TensorPlan(p + "ssm_norm.weight", (SSM_STATE,), F32),
                TensorPlan(p + "ssm_out.weight", (e, value_dim), m.dense),
            ]
        down = m.down_more if _more_bits(il) else m.down
        out += [
            TensorPlan(p + "ffn_gate_inp.weight", (N_EXPERT, e), F32),
            TensorPlan(p + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, e), m.experts),
            TensorPlan(p + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, e), m.experts),
            TensorPlan(p + "ffn_down_exps.weight", (N_EXPERT, e, N_FF_EXP), down),
            TensorPlan(p + "ffn_gate_inp_shexp.weight", (e,), F32),
            TensorPlan(p + "ffn_gate_shexp.weight", (N_FF_SHEXP, e), m.dense),
            TensorPlan(p + "ffn_up_shexp.weight", (N_FF_SHEXP, e), m.dense),
            TensorPlan(p + "ffn_down_shexp.weight", (e, N_FF_SHEXP), down),
        ]
    return out


def _block_pattern(kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks of ``kind``: random quants and packed scales, f16 super-scales small and finite."""
    size = _BLOCK[kind][1]
    n_blocks = _PATTERN_BYTES // size
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    if kind == Q4_K:  # d, dmin (f16) then 12 bytes of 6-bit scales and mins, then 128 bytes of 4-bit quants
        raw[:, 0:2] = rng.uniform(1e-5, 4e-5, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw[:, 2:4] = rng.uniform(1e-5, 4e-5, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:  # Q6_K: 128 + 64 bytes of quants, 16 int8 scales, then d (f16) last
        raw[:, 208:210] = rng.uniform(2e-6, 6e-6, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(-1)


def _f32_values(t: TensorPlan, rng: np.random.Generator) -> np.ndarray:
    n = t.name
    if n.endswith("norm.weight"):
        return (1.0 + rng.normal(0, 0.05, t.shape)).astype(np.float32)
    if n.endswith("ssm_a"):
        return (-np.exp(rng.uniform(-1.0, 0.5, t.shape))).astype(np.float32)
    if n.endswith("ssm_dt.bias"):
        return rng.uniform(-1.0, 1.0, t.shape).astype(np.float32)
    if n.endswith("ssm_conv1d.weight"):
        return rng.normal(0, 0.5, t.shape).astype(np.float32)
    return rng.normal(0, 1.0 / np.sqrt(t.shape[-1]), t.shape).astype(np.float32)


def _tiled(pattern: np.ndarray, n_bytes: int) -> Iterator[memoryview]:
    left = n_bytes
    view = pattern.data  # the array's own buffer, no copy
    while left > 0:
        take = min(left, len(pattern), _CHUNK)
        yield view[:take]
        left -= take


@functools.lru_cache(maxsize=1)
def _vocab() -> tuple[list[str], list[float], list[int]]:
    """The test vocabulary padded with unused pieces to Clover's 248,320 tokens."""
    from clover_local.testing.vocab import build_vocab

    v = build_vocab(700)
    tokens, scores, types = list(v.tokens), list(v.scores), list(v.types)
    for i in range(N_VOCAB - len(tokens)):
        tokens.append(f"<unused{i}>")
        scores.append(0.0)
        types.append(5)  # UNUSED
    return tokens, scores, types


def write_clover_shaped(path: Path, *, seed: int = 7, arch: str = "qwen35moe") -> int:
    """Write the model to ``path`` (overwrites) under the architecture name ``arch`` (:data:`ARCHITECTURES`);
    return its size in bytes."""
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    plan = tensor_plan()
    tokens, scores, types = _vocab()
    w = _header_writer(path, arch, MIXES["Q4_K_M"], plan, (tokens, scores, types))
    assert w.fout is not None
    f = w.fout[0]
    patterns = {k: _block_pattern(k, rng) for k in _BLOCK}
    for t in plan:
        w.write_padding(f, f.tell())
        if t.kind == F32:
            f.write(_f32_values(t, rng).tobytes())
        elif t.name == "output.weight":
            per, size = _BLOCK[t.kind]
            row = t.shape[-1] // per * size
            zero_rows = np.zeros(row * len([x for x in types[:261] if x != 1]), dtype=np.uint8)
            f.write(zero_rows.tobytes())  # control, unknown and byte tokens: logit 0, never the argmax
            for chunk in _tiled(patterns[t.kind], t.n_bytes - len(zero_rows)):
                f.write(chunk)
        else:
            for chunk in _tiled(patterns[t.kind], t.n_bytes):
                f.write(chunk)
        w.write_padding(f, t.n_bytes)
    f.flush()
    w.close()
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1024**3:.2f} GiB) in {time.monotonic() - started:.1f} s", flush=True)
    return size


def _header_writer(
    path: Path,
    arch: str,
    mix: QuantMix,
    plan: list[TensorPlan],
    vocab: tuple[list[str], list[float], list[int]] | None,
    split: tuple[int, int, int] | None = None,
) -> gguf.GGUFWriter:
    """A ``gguf.GGUFWriter`` that has written the header of the Clover-shaped model (``vocab`` None: no metadata,
    a later shard) and the tensor infos of ``plan``; ``split``: (shard index, shard count, tensors in all)."""
    import gguf

    from clover_local.testing.vocab import CHATML_TEMPLATE

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, not {arch!r}")
    w = gguf.GGUFWriter(str(path), arch)
    if split is not None:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[2])
    if vocab is not None:
        w.add_name(f"clover-local Clover-shaped random {mix.file_type}")
        w.add_description("Random weights with Clover-35B-A3B-Preview's shape, for memory and speed checks.")
        w.add_file_type(gguf.LlamaFileType[f"MOSTLY_{mix.file_type}"])
        w.add_context_length(N_CTX_TRAIN)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(N_FF_EXP)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(N_HEAD_KV)
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10_000_000.0)
        w.add_rope_dimension_count(N_ROT)
        half = N_ROT // 2
        w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
        w.add_expert_shared_feed_forward_length(N_FF_SHEXP)
        w.add_ssm_conv_kernel(SSM_CONV)
        w.add_ssm_state_size(SSM_STATE)
        w.add_ssm_group_count(SSM_K_HEADS)
        w.add_ssm_time_step_rank(SSM_V_HEADS)
        w.add_ssm_inner_size(SSM_STATE * SSM_V_HEADS)
        w.add_full_attention_interval(FULL_ATTENTION_INTERVAL)
        w.add_vocab_size(N_VOCAB)
        tokens, scores, types = vocab
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_chat_template(CHATML_TEMPLATE)
    for t in plan:
        if t.kind == F32:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.n_bytes)
        else:
            per, size = _block(t.kind)
            byte_shape = (*t.shape[:-1], t.shape[-1] // per * size)
            w.add_tensor_info(
                t.name, byte_shape, np.dtype(np.uint8), t.n_bytes, raw_dtype=gguf.GGMLQuantizationType[t.kind]
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w


def write_clover_header(paths: list[Path], *, quant: str = "Q4_K_M", arch: str = "clover_moe") -> int:
    """The Clover-shaped model in the mix :data:`MIXES` names ``quant``, header only, split over ``paths`` (one
    path: a whole file; several: its shards, named by the caller as llama.cpp names them), each a sparse file as
    long as the real one would be (zeros after the header: cheap on disk, never to be loaded). Returns the
    bytes of all files together, as a repo listing would show them."""
    import os

    plan = tensor_plan(MIXES[quant])
    per_shard = -(-len(plan) // len(paths))
    total = 0
    for i, path in enumerate(paths):
        part = plan[i * per_shard : (i + 1) * per_shard]
        split = (i, len(paths), len(plan)) if len(paths) > 1 else None
        w = _header_writer(path, arch, MIXES[quant], part, _vocab() if i == 0 else None, split)
        assert w.fout is not None
        end = _aligned(w.fout[0].tell())
        w.close()
        end += sum(_aligned(t.n_bytes) for t in part)
        os.truncate(path, end)  # a hole: no blocks written
        total += end
    return total


def _aligned(n: int, alignment: int = 32) -> int:
    return -(-n // alignment) * alignment

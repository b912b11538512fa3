"""Write tiny random-weight GGUFs that the real llama.cpp loads and runs: llama, qwen3moe and qwen35moe,
and the block-diffusion ``dream`` (dense, Qwen2-like) and ``llada-moe`` (MoE, Q/K norms).

Key names and tensor shapes follow llama.cpp's loaders (``src/models/{llama,qwen3moe,qwen35moe,dream,
llada-moe}.cpp``) and ``convert_hf_to_gguf.py`` (``conversion/dream.py``, ``conversion/llada.py``: a mask
token, ``causal_attention = false``, and for LLaDA-MoE ``diffusion.shift_logits = false``). Shapes below are written in numpy order, the reverse of ggml's ``ne``: a ggml
``{n_embd, n_vocab}`` tensor is a numpy ``(n_vocab, n_embd)`` array.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from clover_local.testing.vocab import CHATML_TEMPLATE, TOKEN_NORMAL, Vocab, build_vocab

TinyKind = Literal["llama", "qwen3moe", "qwen35moe", "dream", "llada-moe"]
DIFFUSION_KINDS: tuple[TinyKind, ...] = ("dream", "llada-moe")
"""Tiny kinds that llama.cpp runs as diffusion models (``llama_model_is_diffusion``)."""
WeightType = Literal["f16", "q8_0"]
MtpPlacement = Literal["none", "embedded", "sidecar"]


@dataclass(frozen=True)
class TinySpec:
    """Everything that decides a tiny model's bytes: the cache key is a hash of this."""

    kind: TinyKind
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 256
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    full_attention_interval: int = 0
    """qwen35moe: every Nth layer is full attention, the rest Gated DeltaNet."""
    n_rot: int = 32
    ssm_conv_kernel: int = 4
    ssm_state: int = 32
    """Gated DeltaNet head size (keys and values)."""
    ssm_k_heads: int = 2
    ssm_v_heads: int = 4
    n_word_pieces: int = 700
    n_ctx_train: int = 4096
    weight_type: WeightType = "f16"
    seed: int = 7
    logit_scale: float = 0.35
    """Std of the output head: larger spreads the logits, so greedy text varies instead of repeating."""
    chat_template: str | None = None
    """Jinja chat template stored in the file; None: ChatML; "": none (a GGUF without a chat template)."""
    mtp: MtpPlacement = "none"
    """qwen35moe: a multi-token-prediction head (one full-attention MoE block, ``blk.<n_layer>.nextn.*``),
    inside the file (``embedded``) or in a separate ``mtp-`` file (``sidecar``, see :func:`write_tiny_mtp`)."""
    arch_name: str | None = None
    """The ``general.architecture`` written (and every ``<arch>.*`` key's prefix); None: ``kind``. A qwen35moe
    written as ``clover_moe`` is what an upstream Clover GGUF looks like to a llama.cpp that knows it by that
    name: the same tensors and keys (no MTP head, no block-diffusion tensors), another name."""
    tool_caller: bool = False
    """llama only: Qwen's ``<tool_call>``/``</tool_call>`` tokens in the vocabulary, and weights wired so that the
    model behaves like a tool-calling one: after a newline (the end of ``<|im_start|>assistant\n``) it opens a
    call, and after closing one it ends its turn. What goes inside the call stays random: a grammar makes it
    well-formed. Real tool-calling models are not on the package index, and llama-server's grammar for a
    required call lets free text come first, so a plain random model never reaches the call there."""
    type_overrides: tuple[tuple[str, WeightType], ...] = ()
    """(tensor-name suffix, type) pairs that override ``weight_type`` for the matrices whose names end so: a
    file whose routed experts' gate and up differ in type (``(("ffn_up_exps.weight", "q8_0"),)`` on an f16
    model), as some community mixes are written."""


def default_spec(kind: TinyKind, weight_type: WeightType = "f16") -> TinySpec:
    """The standard tiny model of each kind used by tests and benchmarks."""
    dense = TinySpec(kind=kind, weight_type=weight_type)
    if kind in ("llama", "dream"):
        return dense
    moe = replace(dense, n_expert=8, n_expert_used=2, n_ff_exp=64, n_ff=128)
    if kind in ("qwen3moe", "llada-moe"):
        return moe
    if kind == "qwen35moe":
        return replace(moe, n_layer=8, head_dim=64, n_rot=16, n_ff_shexp=64, full_attention_interval=4)
    raise ValueError(f"unknown tiny model kind {kind!r}")


def bench_hybrid_spec() -> TinySpec:
    """A random-weight hybrid MoE (qwen35moe: Gated DeltaNet with every 4th layer full attention, 16 experts top
    4 and a shared one, Clover's layout) as slow per token as SmolLM2 135M on a CPU (about 80 tokens/s on 2
    cores, 556 MB at Q8_0), for benchmarks that want a hybrid model's row to be about the engines rather than
    about the per-token overhead a tiny model's sub-millisecond steps magnify. Not used by tests."""
    return TinySpec(
        kind="qwen35moe",
        n_layer=24,
        n_embd=768,
        n_head=12,
        n_head_kv=2,
        head_dim=64,
        n_rot=32,
        n_ff=2048,
        n_expert=16,
        n_expert_used=4,
        n_ff_exp=512,
        n_ff_shexp=512,
        full_attention_interval=4,
        ssm_state=64,
        ssm_k_heads=4,
        ssm_v_heads=8,
        weight_type="q8_0",
        n_word_pieces=4000,
    )


class _Weights:
    """Seeded random tensors in numpy order, typed for the file (norms and SSM scalars stay F32)."""

    def __init__(self, spec: TinySpec) -> None:
        self._rng = np.random.default_rng(spec.seed)

    def matrix(self, *shape: int, std: float | None = None) -> np.ndarray:
        """A weight matrix; std defaults to 1/sqrt(fan_in) so activations keep their scale."""
        fan_in = shape[-1]
        s = std if std is not None else 1.0 / np.sqrt(fan_in)
        return self._rng.normal(0.0, s, size=shape).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + self._rng.normal(0.0, 0.05, size=(n,))).astype(np.float32)

    def uniform(self, low: float, high: float, *shape: int) -> np.ndarray:
        return self._rng.uniform(low, high, size=shape).astype(np.float32)


def write_tiny_gguf(spec: TinySpec, path: Path) -> None:
    """Write the model described by ``spec`` to ``path`` (overwrites). With ``spec.mtp == "embedded"``
    the MTP head is in the file; with ``"sidecar"`` the file is the trunk alone (write the head with
    :func:`write_tiny_mtp`)."""
    if spec.tool_caller and spec.kind != "llama":
        raise ValueError("tool_caller is wired for the llama kind only")
    vocab = _vocab(spec)
    tensors = _tensors(spec, vocab)
    with_head = spec.mtp == "embedded"
    if not with_head:
        tensors = {k: v for k, v in tensors.items() if _layer_of(k) != spec.n_layer}
    _write(spec, vocab, tensors, path, with_head)


def write_tiny_mtp(spec: TinySpec, path: Path) -> None:
    """Write the ``mtp-`` sidecar of a ``spec.mtp == "sidecar"`` model: the same header (block count
    ``n_layer + 1``, ``nextn_predict_layers`` 1), the token embedding, output norm and head, and the MTP
    block only, as llama.cpp's ``mtp_only`` loader expects (``src/models/qwen35moe.cpp``)."""
    if spec.kind != "qwen35moe" or spec.mtp != "sidecar":
        raise ValueError("an MTP sidecar needs a qwen35moe spec with mtp='sidecar'")
    vocab = _vocab(spec)
    tensors = {k: v for k, v in _tensors(spec, vocab).items() if _layer_of(k) in (None, spec.n_layer)}
    _write(spec, vocab, tensors, path, with_head=True)


def _vocab(spec: TinySpec) -> Vocab:
    return build_vocab(
        spec.n_word_pieces, with_mask=spec.kind in DIFFUSION_KINDS, tool_tokens=spec.tool_caller
    )


def _layer_of(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("blk.") else None


def _write(spec: TinySpec, vocab: Vocab, tensors: dict[str, np.ndarray], path: Path, with_head: bool) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), spec.arch_name or spec.kind)
    _add_header(writer, spec, vocab, with_head)
    for name, array in tensors.items():
        kind = next((t for suffix, t in spec.type_overrides if name.endswith(suffix)), spec.weight_type)
        _add_tensor(writer, name, array, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tensor(writer: object, name: str, array: np.ndarray, weight_type: WeightType) -> None:
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    if array.ndim == 1 or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp_shexp.weight")):
        writer.add_tensor(name, array.astype(np.float32))
    elif weight_type == "q8_0":
        q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        writer.add_tensor(name, array.astype(np.float16))


def _add_header(writer: object, spec: TinySpec, vocab: Vocab, with_head: bool = False) -> None:
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    writer.add_name(f"clover-local tiny random {spec.kind}")
    writer.add_description("Random weights for tests: the text it writes means nothing.")
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_Q8_0 if spec.weight_type == "q8_0" else gguf.LlamaFileType.MOSTLY_F16
    )
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    # llama.cpp counts an MTP block among the blocks: n_layer() = block_count - nextn_predict_layers.
    writer.add_block_count(spec.n_layer + (1 if with_head else 0))
    if with_head:
        writer.add_uint32(f"{writer.arch}.nextn_predict_layers", 1)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(vocab))
    if spec.kind != "llama":
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.n_rot)
    if spec.n_expert:
        writer.add_expert_count(spec.n_expert)
        writer.add_expert_used_count(spec.n_expert_used)
        writer.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.kind == "qwen35moe":
        writer.add_expert_shared_feed_forward_length(spec.n_ff_shexp)
        writer.add_ssm_conv_kernel(spec.ssm_conv_kernel)
        writer.add_ssm_state_size(spec.ssm_state)
        writer.add_ssm_group_count(spec.ssm_k_heads)
        writer.add_ssm_time_step_rank(spec.ssm_v_heads)
        writer.add_ssm_inner_size(spec.ssm_state * spec.ssm_v_heads)
        writer.add_full_attention_interval(spec.full_attention_interval)
        half = spec.n_rot // 2
        writer.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])

    if spec.kind in DIFFUSION_KINDS:
        assert vocab.mask_id is not None
        writer.add_causal_attention(False)
        writer.add_mask_token_id(vocab.mask_id)
        if spec.kind == "llada-moe":
            writer.add_diffusion_shift_logits(False)  # as conversion/llada.py; Dream leaves it unset (true)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_add_bos_token(True)
    if spec.chat_template is not None:
        # No SentencePiece space before text that follows a control token: "<|im_start|>assistant" then
        # tokenizes as llama-server's tool grammars spell it (as in Qwen's BPE vocabulary).
        writer.add_add_space_prefix(False)
    writer.add_add_eos_token(False)
    if spec.chat_template != "":
        writer.add_chat_template(spec.chat_template or CHATML_TEMPLATE)


def _tensors(spec: TinySpec, vocab: Vocab) -> dict[str, np.ndarray]:
    w = _Weights(spec)
    e = spec.n_embd
    out: dict[str, np.ndarray] = {
        "token_embd.weight": w.matrix(len(vocab), e, std=1.0),
        "output_norm.weight": w.norm(e),
        "output.weight": _output_head(w, spec, vocab),
    }
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        if spec.kind in ("llama", "dream"):
            out.update(_llama_block(w, spec, p))
        elif spec.kind in ("qwen3moe", "llada-moe"):
            out.update(_qwen3moe_block(w, spec, p))
        else:
            out.update(_qwen35moe_block(w, spec, p, (il + 1) % spec.full_attention_interval == 0))
    if spec.mtp != "none":
        # Drawn after the trunk, so the trunk's weights are the same with or without a head.
        out.update(_qwen35moe_mtp_block(w, spec, f"blk.{spec.n_layer}."))
    if spec.tool_caller:
        _wire_tool_calls(out, spec, vocab)
    return out


TOOL_WIRING: dict[str, float] = {
    "strength": 8.0,
    "open": 2.0,
    "close": 1.5,
    "end": 2.0,
    "newline": 2.0,
    "brace": 1.5,
}
"""Residual value of a wired dimension at its trigger token, and the output head's gain from it into
``<tool_call>``, ``</tool_call>``, end-of-turn, the newline after ``<tool_call>`` and ``</tool_call>`` after a
closing brace (part of a tool-caller's cache key)."""


def _wire_tool_calls(tensors: dict[str, np.ndarray], spec: TinySpec, vocab: Vocab) -> None:
    """Four residual dimensions that no layer writes to carry "the input token is a newline" (dim 0),
    "... is ``</tool_call>``" (dim 1), "... is ``<tool_call>``" (dim 2) and "... ends with ``}``" (dim 3)
    straight to the output head, which reads dim 0 into ``<tool_call>`` (or, where a grammar allows only
    closing, ``</tool_call>``), dim 1 into end-of-turn, dim 2 into a newline and dim 3 into ``</tool_call>``
    (where a grammar allows it: after the call's last brace). So: Qwen's ``<tool_call>\n{...}\n</tool_call>``,
    once, then the end of the turn. Applied after all weights are drawn, so the rest of the model
    is the plain random llama of the same seed."""
    assert vocab.tool_call_id is not None and vocab.tool_call_end_id is not None
    newline = vocab.tokens.index("<0x0A>")
    embd = tensors["token_embd.weight"]
    embd[:, :4] = 0.0
    embd[newline, 0] = TOOL_WIRING["strength"]
    embd[vocab.tool_call_end_id, 1] = TOOL_WIRING["strength"]
    embd[vocab.tool_call_id, 2] = TOOL_WIRING["strength"]
    for i, text in enumerate(vocab.tokens):
        if text.endswith("}"):
            embd[i, 3] = TOOL_WIRING["strength"]
    for name, array in tensors.items():
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            array[:4, :] = 0.0
    head = tensors["output.weight"]
    head[:, :4] = 0.0
    head[vocab.tool_call_id, 0] = TOOL_WIRING["open"] * TOOL_WIRING["strength"]
    # Where a grammar forbids opening (right after a call's JSON), the newline closes the call.
    head[vocab.tool_call_end_id, 0] = TOOL_WIRING["close"] * TOOL_WIRING["strength"]
    head[vocab.eos_id, 1] = TOOL_WIRING["end"] * TOOL_WIRING["strength"]
    head[newline, 2] = TOOL_WIRING["newline"] * TOOL_WIRING["strength"]
    head[vocab.tool_call_end_id, 3] = TOOL_WIRING["brace"] * TOOL_WIRING["strength"]


def _output_head(w: _Weights, spec: TinySpec, vocab: Vocab) -> np.ndarray:
    """Random rows, except that control and byte tokens (but newline) get a zero row: their logit stays
    0 while word pieces spread around it, so greedy text is printable words and never ends early."""
    head = w.matrix(len(vocab), spec.n_embd, std=spec.logit_scale)
    newline = vocab.tokens.index("<0x0A>")
    for i, t in enumerate(vocab.types):
        if t != TOKEN_NORMAL and i != newline:
            head[i] = 0.0
    return head


def _attention(w: _Weights, spec: TinySpec, p: str, q_mult: int = 1) -> dict[str, np.ndarray]:
    e, hd = spec.n_embd, spec.head_dim
    return {
        p + "attn_q.weight": w.matrix(hd * spec.n_head * q_mult, e),
        p + "attn_k.weight": w.matrix(hd * spec.n_head_kv, e),
        p + "attn_v.weight": w.matrix(hd * spec.n_head_kv, e),
        p + "attn_output.weight": w.matrix(e, hd * spec.n_head),
    }


def _experts(w: _Weights, spec: TinySpec, p: str) -> dict[str, np.ndarray]:
    e, f, n = spec.n_embd, spec.n_ff_exp, spec.n_expert
    return {
        p + "ffn_gate_inp.weight": w.matrix(n, e, std=1.0),
        p + "ffn_gate_exps.weight": w.matrix(n, f, e),
        p + "ffn_up_exps.weight": w.matrix(n, f, e),
        p + "ffn_down_exps.weight": w.matrix(n, e, f),
    }


def _llama_block(w: _Weights, spec: TinySpec, p: str) -> dict[str, np.ndarray]:
    e, f = spec.n_embd, spec.n_ff
    return {
        p + "attn_norm.weight": w.norm(e),
        **_attention(w, spec, p),
        p + "ffn_norm.weight": w.norm(e),
        p + "ffn_gate.weight": w.matrix(f, e),
        p + "ffn_up.weight": w.matrix(f, e),
        p + "ffn_down.weight": w.matrix(e, f),
    }


def _qwen3moe_block(w: _Weights, spec: TinySpec, p: str) -> dict[str, np.ndarray]:
    e = spec.n_embd
    return {
        p + "attn_norm.weight": w.norm(e),
        **_attention(w, spec, p),
        p + "attn_q_norm.weight": w.norm(spec.head_dim),
        p + "attn_k_norm.weight": w.norm(spec.head_dim),
        p + "ffn_norm.weight": w.norm(e),
        **_experts(w, spec, p),
    }


def _qwen35moe_block(w: _Weights, spec: TinySpec, p: str, full_attention: bool) -> dict[str, np.ndarray]:
    e = spec.n_embd
    out: dict[str, np.ndarray] = {
        p + "attn_norm.weight": w.norm(e),
        p + "post_attention_norm.weight": w.norm(e),
    }
    if full_attention:
        # Full attention: Q carries a gate as well (2 x head_dim per head), Q/K are RMS-normed.
        out.update(_attention(w, spec, p, q_mult=2))
        out[p + "attn_q_norm.weight"] = w.norm(spec.head_dim)
        out[p + "attn_k_norm.weight"] = w.norm(spec.head_dim)
    else:
        # Gated DeltaNet (linear attention, recurrent state).
        d = spec.ssm_state
        key_dim = d * spec.ssm_k_heads
        value_dim = d * spec.ssm_v_heads
        conv_dim = 2 * key_dim + value_dim
        out.update(
            {
                p + "attn_qkv.weight": w.matrix(conv_dim, e),
                p + "attn_gate.weight": w.matrix(value_dim, e),
                p + "ssm_conv1d.weight": w.matrix(conv_dim, spec.ssm_conv_kernel, std=0.5),
                p + "ssm_dt.bias": w.uniform(-1.0, 1.0, spec.ssm_v_heads),
                # -exp(A_log), as the converter stores it: negative, so the state decays.
                p + "ssm_a": -np.exp(w.uniform(-1.0, 0.5, spec.ssm_v_heads)),
                p + "ssm_beta.weight": w.matrix(spec.ssm_v_heads, e),
                p + "ssm_alpha.weight": w.matrix(spec.ssm_v_heads, e),
                p + "ssm_norm.weight": w.norm(d),
                p + "ssm_out.weight": w.matrix(e, value_dim),
            }
        )
    f = spec.n_ff_shexp
    out.update(_experts(w, spec, p))
    out.update(
        {
            p + "ffn_gate_inp_shexp.weight": w.matrix(e, std=1.0 / np.sqrt(e)),
            p + "ffn_gate_shexp.weight": w.matrix(f, e),
            p + "ffn_up_shexp.weight": w.matrix(f, e),
            p + "ffn_down_shexp.weight": w.matrix(e, f),
        }
    )
    return out


def _qwen35moe_mtp_block(w: _Weights, spec: TinySpec, p: str) -> dict[str, np.ndarray]:
    """The MTP head: a full-attention decoder block with the MoE FFN, plus ``nextn.*`` (``eh_proj`` mixes
    the next token's normed embedding with the trunk's hidden state; ``shared_head_norm`` before the LM
    head). ``eh_proj`` passes the embedding half through nearly unchanged, so the head's guess leans on
    the token it is given, as the trunk's does: drafts are then sometimes accepted, which tests want."""
    e = spec.n_embd
    eh_proj = w.matrix(e, 2 * e, std=0.02)
    eh_proj[:, :e] += np.eye(e, dtype=np.float32)  # ggml_concat(e_norm, h_norm): embedding first
    return {
        **_qwen35moe_block(w, spec, p, full_attention=True),
        p + "nextn.eh_proj.weight": eh_proj,
        p + "nextn.enorm.weight": w.norm(e),
        p + "nextn.hnorm.weight": w.norm(e),
        p + "nextn.shared_head_norm.weight": w.norm(e),
    }

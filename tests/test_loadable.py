"""Whether a runtime's loader takes a GGUF, from its header (``gguf.loadable``), checked against the real loader:
tiny GGUFs written with ``clover_local.testing.gguf_writer``, one with its experts' gate and up in different types
(as a Clover community mix was reported to be), loaded by the pinned llama.cpp."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from clover_local.gguf.header import read_local_header
from clover_local.gguf.loadable import MAINLINE, Loader, load_problem
from clover_local.testing.gguf_writer import default_spec, write_tiny_gguf

MIXED = (("ffn_up_exps.weight", "q8_0"),)
"""The experts' up in Q8_0, their gate (and everything else) in F16."""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("loadable") / "mixed-gate-up.gguf"
    write_tiny_gguf(dataclasses.replace(default_spec("qwen35moe"), type_overrides=MIXED), path)
    return path


@pytest.fixture(scope="module")
def uniform(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("loadable") / "uniform.gguf"
    write_tiny_gguf(default_spec("qwen35moe", "q8_0"), path)
    return path


def test_mainline_llama_cpp_loads_experts_whose_gate_and_up_differ_in_type(mixed: Path) -> None:
    import llama_cpp

    desc = read_local_header(mixed)
    types = {t.name.rsplit(".", 2)[-2]: t.ggml_type for t in desc.tensors or () if t.layer == 0}
    assert (types["ffn_gate_exps"], types["ffn_up_exps"]) == ("F16", "Q8_0")
    assert load_problem(desc) is None  # the check says it loads ...
    llm = llama_cpp.Llama(model_path=str(mixed), n_ctx=256, verbose=False)  # ... and the real loader agrees
    try:
        out = llm.create_completion("hello", max_tokens=4, temperature=0.0)
        assert out["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


def test_a_loader_that_fuses_gate_and_up_is_refused_a_mixed_file_and_given_a_uniform_one(
    mixed: Path, uniform: Path
) -> None:
    fork = Loader("a fork that fuses them", fuses_gate_up=True)
    said = load_problem(read_local_header(mixed), fork)
    assert said is not None and "gate F16, up Q8_0" in said and "in 8 layers" in said
    assert load_problem(read_local_header(uniform), fork) is None


def test_a_type_the_loader_does_not_know_is_refused(uniform: Path) -> None:
    older = Loader("an older llama.cpp", types=MAINLINE.types - {"Q8_0"})
    said = load_problem(read_local_header(uniform), older)
    assert said == "it holds tensors of type Q8_0, which an older llama.cpp does not load"
    assert load_problem(read_local_header(uniform)) is None

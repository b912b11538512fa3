"""Loading: settings reach llama.cpp (MoE expert overrides in its load log), one safer retry when memory runs
out, clear errors for files llama.cpp cannot read. Real llama.cpp on tiny random GGUFs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clover_local.engine import native
from clover_local.engine.loader import load_engine
from clover_local.errors import EngineError, OutOfMemoryError, UsageError
from clover_local.gguf.header import read_local_header
from clover_local.testing.models import tiny_model
from clover_local.testing.settings import engine_settings

pytestmark = pytest.mark.slow


def _overridden_tensors(lines: list[str]) -> list[str]:
    return [ln.split()[1] for ln in lines if "buffer type overridden to CPU" in ln]


def test_n_cpu_moe_overrides_reach_llama_cpp_for_the_first_layers_only() -> None:
    path = tiny_model("qwen3moe")
    params = native.build_params(engine_settings(path, ctx=256, n_cpu_moe=2))
    from llama_cpp import llama_cpp as C

    with native.LogCapture() as log:
        model = C.llama_model_load_from_file(str(path).encode(), params.model)
    assert model
    C.llama_model_free(model)
    overridden = _overridden_tensors(log.lines)
    layers = {name.split(".")[1] for name in overridden}
    assert layers == {"0", "1"}
    assert all("_exps" in name for name in overridden)
    assert len(overridden) == 6  # gate, up, down experts of two layers


def test_loader_reports_overridden_experts_in_its_placement() -> None:
    result = load_engine(
        tiny_model("qwen35moe"),
        engine_settings(tiny_model("qwen35moe"), ctx=256, n_cpu_moe=8),
        chat_template="completion",
    )
    try:
        assert "24 expert tensors kept in RAM by override" in result.placement
        assert "recurrent state" in result.placement
    finally:
        result.engine.close()


def test_progress_callback_sees_loading_finish() -> None:
    seen: list[float] = []
    result = load_engine(
        tiny_model("llama"),
        engine_settings(tiny_model("llama"), ctx=256),
        chat_template="completion",
        progress=seen.append,
    )
    result.engine.close()
    assert seen and seen[-1] == pytest.approx(1.0)


def test_out_of_memory_is_an_error_the_loader_does_not_rewrite() -> None:
    # 32M cells of f32 K and V on the tiny llama: 64 GiB of KV cache, more than this machine has. Planning
    # again for less memory is the launch's (tests/test_launch.py), never the loader's.
    settings = engine_settings(tiny_model("llama"), ctx=2**25, cache_type_k="f32", cache_type_v="f32")
    with pytest.raises(OutOfMemoryError, match="not enough memory"):
        load_engine(tiny_model("llama"), settings, chat_template="completion")


def test_truncated_gguf_is_a_clear_error(tmp_path: Path) -> None:
    data = tiny_model("llama").read_bytes()
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(EngineError, match="corrupt or truncated") as info:
        load_engine(broken, engine_settings(tiny_model("llama"), ctx=256), chat_template="completion")
    assert info.value.fix and "download it again" in info.value.fix


def test_garbage_bytes_are_not_a_gguf(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x7fELF" + bytes(range(256)) * 8)
    with pytest.raises(EngineError, match="is not a GGUF file"):
        load_engine(junk, engine_settings(tiny_model("llama"), ctx=256))


def test_gguf_header_with_garbage_after_magic_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 4096)
    with pytest.raises(EngineError, match="could not load the model"):
        load_engine(junk, engine_settings(tiny_model("llama"), ctx=256))


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="does not exist"):
        load_engine(tmp_path / "nope.gguf", engine_settings(tiny_model("llama"), ctx=256))


def test_unknown_architecture_names_it(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "alien.gguf"
    writer = gguf.GGUFWriter(str(path), "nonesuch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(EngineError, match="architecture 'nonesuch'"):
        load_engine(path, engine_settings(tiny_model("llama"), ctx=256))


def test_bad_settings_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="Unknown engine setting"):
        native.build_params({**engine_settings(tiny_model("llama"), ctx=256), "n_ctxx": 5})
    with pytest.raises(UsageError, match="<regex>=CPU"):
        native.build_params(
            {**engine_settings(tiny_model("llama"), ctx=256), "tensor_buft_overrides": ["exps=CUDA0"]}
        )
    # No hidden defaults: a setting the producer always gives is required.
    partial = {k: v for k, v in engine_settings(tiny_model("llama"), ctx=256).items() if k != "n_threads"}
    with pytest.raises(UsageError, match="missing: n_threads") as info:
        native.build_params(partial)
    assert info.value.fix and "llama_settings(plan)" in info.value.fix


def test_importing_the_engine_package_does_not_import_llama_cpp() -> None:
    code = "import sys, clover_local.engine, clover_local.engine.types; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_hybrid_model_allocates_snapshots_for_a_drafter_head_and_none_for_ngram_drafts() -> None:
    """What llama.cpp allocates is what the planner budgets (``plan.memory.recurrent_copies``): n-gram drafting
    holds no snapshots in llama.cpp (one copy of the state, taken per draft in RAM, is counted beside it); the
    settings an MTP head's drafts get hold one snapshot per drafted token."""
    from clover_local.plan.memory import recurrent_copies, rollback_snapshots
    from clover_local.plan.types import SpeculativePlan

    path = tiny_model("qwen35moe")
    arch = read_local_header(path).architecture
    off = SpeculativePlan(enabled=False)
    ngram = SpeculativePlan(enabled=True, n_max=8)
    mtp = SpeculativePlan(enabled=True, n_max=8, mode="mtp")
    sizes = {}
    for name, plan, loaded_with in (("off", off, off), ("ngram", ngram, ngram), ("mtp", mtp, off)):
        # The MTP settings are loaded without the head (the tiny model has none): only their snapshots matter.
        settings = engine_settings(path, ctx=256, speculative=plan)
        result = load_engine(path, settings, chat_template="completion", speculative=loaded_with)
        result.engine.close()
        line = next(ln for ln in result.load_log if "RS buffer size" in ln)
        sizes[name] = float(line.split("=")[1].split()[0])
    assert (rollback_snapshots(ngram), rollback_snapshots(mtp)) == (0, 9)
    assert sizes["ngram"] == pytest.approx(sizes["off"], rel=0.01)
    assert recurrent_copies(arch, ngram) == 2  # the state and the copy a rejected draft is rolled back to
    assert sizes["mtp"] == pytest.approx(sizes["off"] * recurrent_copies(arch, mtp), rel=0.01)
    assert recurrent_copies(arch, mtp) == 10
    assert sizes["off"] * 2**20 == pytest.approx(arch.recurrent_state_bytes, abs=0.005 * 2**20)


def test_a_hybrid_model_without_the_snapshots_a_drafter_head_needs_is_refused_not_fixed() -> None:
    """The loader changes no setting: settings made for no speculation, loaded for MTP drafting on a hybrid
    model, are an error that names what is short (the producer would have given the snapshots); n-gram drafting
    needs none of them."""
    from clover_local.plan.types import SpeculativePlan

    path = tiny_model("qwen35moe")
    mtp = SpeculativePlan(enabled=True, mode="mtp")
    settings = engine_settings(path, ctx=256, speculative=SpeculativePlan(enabled=False))
    settings["n_outputs_max_per_seq"] = 17  # short of snapshots only
    with pytest.raises(EngineError, match=r"n_rs_seq 0 \(needs 17\)") as info:
        load_engine(path, settings, chat_template="completion", speculative=mtp)
    assert info.value.fix and "llama_settings" in info.value.fix
    loaded = load_engine(
        path, settings, chat_template="completion", speculative=SpeculativePlan(enabled=True)
    )
    loaded.engine.close()

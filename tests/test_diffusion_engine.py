"""Diffusion generation in the embedded engine, checked token for token against ``llama-diffusion-cli`` (built
from the same pinned llama.cpp by scripts/build-llama-server) on tiny random ``dream`` and ``llada-moe`` models."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from clover_local import settings
from clover_local.engine.diffusion_schedule import Algorithm
from clover_local.engine.types import ChatMessage, Finished, GenerationRequest, Refining, TextDelta
from clover_local.gguf.header import read_local_header
from clover_local.testing.settings import engine_settings

if TYPE_CHECKING:
    from clover_local.engine.diffusion_engine import DiffusionEngine

_REAL_CLI = settings.llama_server_dir() / "llama-diffusion-cli"
PROMPT = "The capital of France is"
UB = 96
THREADS = 1


def diffusion_cli() -> Path:
    if _REAL_CLI.is_file() and os.access(_REAL_CLI, os.X_OK):
        return _REAL_CLI
    message = f"no llama-diffusion-cli ({_REAL_CLI}); run scripts/build-llama-server"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must build it before the tests)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def diffusion_models() -> dict[str, Path]:
    from clover_local.testing.models import DIFFUSION_KINDS, tiny_model

    return {kind: tiny_model(kind) for kind in DIFFUSION_KINDS}


def cli_args(kind: str) -> list[str]:
    """The schedule of each family, as llama.cpp's diffusion README runs them."""
    if kind == "dream":
        return ["--diffusion-eps", "0.001", "--diffusion-steps", "24"]
    return ["--diffusion-block-length", "32", "--diffusion-steps", "24"]


def run_cli(model: Path, kind: str, algorithm: Algorithm, seed: int) -> str:
    cmd = [
        str(diffusion_cli()),
        "-m",
        str(model),
        "-p",
        PROMPT,
        "-ub",
        str(UB),
        "-b",
        str(UB),
        "-c",
        str(UB),
        "-t",
        str(THREADS),
        "--temp",
        "0",
        "--seed",
        str(seed),
        "--diffusion-algorithm",
        str(int(algorithm)),
        *cli_args(kind),
    ]
    from tests.diffusion_cli import CliOutputLost
    from tests.diffusion_cli import run_cli as run

    try:
        return run(cmd).text
    except CliOutputLost as exc:
        pytest.skip(f"{exc} (its logger's last lines race its exit)")


def load(model: Path) -> DiffusionEngine:
    from clover_local.engine.loader import load_engine
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.diffusion import plan_diffusion

    plan, _ = plan_diffusion(read_local_header(model), ctx=UB)
    engine = load_engine(model, engine_settings(model, ctx=UB, threads=THREADS), diffusion=plan).engine
    from clover_local.engine.diffusion_engine import DiffusionEngine

    assert isinstance(engine, DiffusionEngine)
    return engine


@pytest.mark.parametrize("kind", ["dream", "llada-moe"])
@pytest.mark.parametrize("algorithm", [Algorithm.CONFIDENCE, Algorithm.ENTROPY, Algorithm.MARGIN])
def test_tokens_equal_llama_diffusion_cli(
    diffusion_models: dict[str, Path], kind: str, algorithm: Algorithm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same tokens as the cli, so the engine loads the weights where the cli does. The cli builds its model
    params from ``llama_model_default_params()`` and ignores ``--no-repack``: it always puts weights in
    llama.cpp's extra CPU buffer types. On a CPU with AMX that is the AMX buffer, whose AVX-512 kernel multiplies
    F16 weights by F32 activations where the plain CPU path first rounds the activations to F16 (logits differ
    by ~0.2%, enough to reorder the entropy and margin scores); the engine's own rule keeps AMX CPUs off those
    buffers (``engine.repack``). Elsewhere both paths are the same and the patch changes nothing."""
    from clover_local.engine import native

    monkeypatch.setattr(native, "_repack_default", lambda: True)
    model = diffusion_models[kind]
    seed = 1234
    expected = run_cli(model, kind, algorithm, seed)
    engine = load(model)
    try:
        runner = engine.runner
        # The cli renders the prompt with the GGUF's chat template (it has no switch to turn that off).
        prompt = engine.tokenize(
            engine.render_prompt((ChatMessage("user", PROMPT),)), add_special=True, parse_special=True
        )
        block = 32 if kind == "llada-moe" else 0
        params = runner.params(
            max_length=UB,
            steps=24,
            algorithm=algorithm,
            eps=0.001 if not block else 0.0,
            block_length=block,
            temperature=0.0,
            top_k=40,
            top_p=0.95,
            seed=seed,
        )
        assert runner.shift_logits is (kind == "dream")  # llada-moe's header says false; dream has no key
        result = runner.generate(prompt, params)
    finally:
        engine.close()
    assert result.unmasked == UB - len(prompt)
    got = engine.detokenize(result.tokens)
    assert len(expected) > 20
    assert got == expected


def test_engine_streams_masks_then_text_and_cancels(diffusion_models: dict[str, Path]) -> None:
    engine = load(diffusion_models["llada-moe"])
    try:
        request = GenerationRequest(prompt=PROMPT, max_tokens=64, temperature=0.0, seed=7)
        events = list(engine.generate(request))
        refining = [e for e in events if isinstance(e, Refining)]
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        finished = events[-1]
        assert isinstance(finished, Finished)
        stats = finished.stats.diffusion
        assert stats is not None and stats.steps == len(refining)
        assert refining[0].masked > 0 and "\u2591" in refining[0].text
        assert refining[-1].masked == 0
        assert text and "\u2591" not in text
        assert stats.tokens_per_step == pytest.approx(stats.answer_tokens / stats.steps, rel=1e-3)

        cancel = threading.Event()
        seen = 0
        for event in engine.generate(request, cancel):
            if isinstance(event, Refining):
                seen += 1
                cancel.set()
            if isinstance(event, Finished):
                assert event.stats.finish_reason == "cancelled"
                assert event.stats.diffusion is not None and event.stats.diffusion.steps == 1
        assert seen == 1
    finally:
        engine.close()


def test_diffusion_options_on_autoregressive_model_are_an_error(tmp_path: Path) -> None:
    from clover_local.errors import UsageError
    from clover_local.model_files import diffusion_plan_for_file as header_diffusion_plan
    from clover_local.plan.diffusion import DiffusionWishes
    from clover_local.testing.models import tiny_model

    with pytest.raises(UsageError, match="decodes left to right"):
        header_diffusion_plan(tiny_model("llama"), None, DiffusionWishes(steps_per_block=8))
    assert header_diffusion_plan(tiny_model("llama"), None, None) == (None, [])


@pytest.mark.parametrize("kind", ["dream", "llada-moe"])
@pytest.mark.parametrize("canvas", [256, 1024])
def test_planned_buffers_match_llama_cpp_load_log(kind: str, canvas: int) -> None:
    """The plan's compute + output bytes for a canvas against what llama.cpp reserves (its load log) plus the
    output buffer it grows to on the first step (canvas x vocabulary floats); no KV cache at all."""
    from clover_local.engine.loader import load_engine
    from clover_local.plan import memory
    from clover_local.plan.diffusion import plan_diffusion
    from clover_local.testing.measure import parse_buffer_log
    from clover_local.testing.models import tiny_model

    path = tiny_model(kind)
    desc = read_local_header(path)
    plan, _ = plan_diffusion(desc, ctx=canvas)
    result = load_engine(
        path, engine_settings(path, ctx=canvas, threads=THREADS, flash_attn="on"), diffusion=plan
    )
    result.engine.close()
    logged = parse_buffer_log("\n".join(result.load_log))
    assert "kv" not in logged
    assert result.settings_used["n_ubatch"] == canvas
    real = logged["compute"] + canvas * desc.architecture.n_vocab * 4
    planned = memory.place(desc, ctx=canvas, n_gpus=0, n_gpu_layers=0, n_cpu_moe=0, n_ubatch=canvas)
    assert planned.ram_kv == 0
    assert 0.7 <= planned.ram_compute / real <= 1.3, (planned.ram_compute, logged)


def test_run_json_gives_text_and_diffusion_stats(diffusion_models: dict[str, Path]) -> None:
    import json
    import sys

    exe = Path(sys.executable).with_name("clover-local")
    cmd = [str(exe), "run", "--model", str(diffusion_models["dream"]), "--prompt", PROMPT, "--json"]
    cmd += ["--max-tokens", "48", "--temperature", "0", "--threads", str(THREADS), "--diffusion-steps", "12"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    stats = out["stats"]["diffusion"]
    assert out["text"] and "\u2591" not in out["text"]
    assert stats["schedule"] == "timestep" and stats["algorithm"] == "confidence"
    assert 0 < stats["steps"] <= 12 and stats["answer_tokens"] == 48
    assert stats["tokens_per_step"] == pytest.approx(48 / stats["steps"], rel=1e-3)
    assert "Diffusion decoding (dream)" in done.stderr  # the plan's reasons, as notes


def test_bench_compares_block_lengths_side_by_side(diffusion_models: dict[str, Path]) -> None:
    import json
    import sys

    exe = Path(sys.executable).with_name("clover-local")
    cmd = [str(exe), "bench", "--model", str(diffusion_models["llada-moe"]), "--rounds", "1", "--json"]
    cmd += ["--threads", str(THREADS), "--max-tokens", "32", "--ctx", "256"]
    cmd += ["--block-lengths", "16,8", "--tokens-per-step", "1,4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    assert [(r["block_length"], r["tokens_per_step"]) for r in rows] == [(16, 1), (16, 4), (8, 1), (8, 4)]
    assert rows[0]["changed_vs_reference"] == 0.0
    assert rows[1]["steps"] < rows[0]["steps"]
    assert all(r["tokens_per_s_median"] > 0 for r in rows)


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_every_algorithm_fills_the_canvas_and_a_seed_repeats_it(
    diffusion_models: dict[str, Path], algorithm: Algorithm
) -> None:
    """All five algorithms, both schedules, greedy (temperature 0) and sampled (temperature 0.8, alg_temp, Gumbel
    noise): every answer position ends unmasked (but for origin on the block schedule), and the same seed gives
    the same tokens."""
    engine = load(diffusion_models["llada-moe"])
    try:
        runner = engine.runner
        prompt = engine.tokenize(PROMPT)
        for block, temperature, extra in (
            (32, 0.0, {}),
            (0, 0.8, {"alg_temp": 0.5, "add_gumbel_noise": True}),
        ):
            params = runner.params(
                max_length=UB,
                steps=12,
                algorithm=algorithm,
                eps=0.0 if block else 0.001,
                block_length=block,
                temperature=temperature,
                seed=5,
                **extra,
            )
            first = runner.generate(prompt, params)
            again = runner.generate(prompt, params)
            assert first.tokens == again.tokens
            if algorithm == Algorithm.ORIGIN and block:
                # Origin unmasks each position with the step's probability; on the block schedule no step
                # forces the rest (llama.cpp's too), so a few masks may remain.
                assert first.unmasked > (UB - len(prompt)) // 2
            else:
                assert first.unmasked == UB - len(prompt), (algorithm, block)
    finally:
        engine.close()


def test_cli_output_is_parsed() -> None:
    from tests.diffusion_cli import parse_cli_output

    sample = (
        "load_tensors: CPU model buffer size = 1.53 MiB\n\rdiffusion step: 23/24 [====] 95%"
        "\ntotal time: 412.50ms, time per step: 17.19ms, sampling time per step: 1.02ms\n"
        "\n the answer\nsecond line\n~llama_context: CPU compute buffer size is 1.2 MiB\n"
    )
    run = parse_cli_output(sample)
    assert run.text == " the answer\nsecond line" and run.seconds == pytest.approx(0.4125)
    assert run.sampling_s_per_step == pytest.approx(0.00102)
    with pytest.raises(ValueError, match="total time"):
        parse_cli_output("error: failed to load model")


@pytest.mark.parametrize(("n_vocab", "k"), [(825, 40), (41, 40), (100, 40), (262_144, 40), (1000, 1)])
def test_top_k_cut_keeps_every_row_s_top_k_in_id_order(n_vocab: int, k: int) -> None:
    """The numpy cut before the chain's ``top_k`` (``_top_k_superset``) must keep each row's k highest logits,
    ties at the k-th included, in id order; NaN rows make it decline (the chain then sees the whole row)."""
    import numpy as np

    from clover_local.engine.diffusion import _top_k_superset

    rng = np.random.default_rng(n_vocab + k)
    sub = (rng.standard_normal((7, n_vocab)) * 3).astype(np.float32)
    sub[1, :] = 0.5  # a row of ties
    sub[2, rng.choice(n_vocab, min(k + 3, n_vocab), replace=False)] = 9.0  # ties right at the top
    cut = _top_k_superset(sub, k)
    assert cut is not None
    cols, vals, counts = cut
    assert int(counts.sum()) == len(cols) == len(vals)
    start = 0
    for row in range(len(sub)):
        ids = cols[start : start + counts[row]]
        start += counts[row]
        kth = np.sort(sub[row])[-k]
        must = np.flatnonzero(sub[row] >= kth)
        assert set(must.tolist()) <= set(ids.tolist())
        assert np.all(np.diff(ids) > 0)
        assert np.array_equal(sub[row, ids], vals[start - counts[row] : start])
    random_rows = counts[[0, 3, 4, 5, 6]]
    assert n_vocab <= k + 1 or int(random_rows.max()) < n_vocab  # it does cut, not hand the row over whole

    for col in (5, n_vocab - 1):  # in the sets, and in the tail they leave out
        row = sub.copy()
        row[3, col] = np.nan
        assert _top_k_superset(row, k) is None

#!/usr/bin/env python3
"""Diffusion speed: the embedded engine against ``llama-diffusion-cli`` on the same generation (JSON out).

    .venv/bin/python benchmarks/bench_diffusion.py --rounds 5 --out .bench/diffusion.json

For each model (tiny random ``dream`` and ``llada-moe``, and a larger ``dream`` where decoding dominates):
the same prompt, canvas, steps, algorithm, seed and threads through ``llama-diffusion-cli`` (its own
``total time`` line: the generation loop, after the sampler chain and batch are set up) and through the
engine's runner (its ``seconds``: the same loop, timed from the same point), interleaved, and which one goes first alternates from round to round; both outputs
must be equal. Prints the median times and the speed ratio: the median over rounds of (cli time / engine time)
within each round, so that a slow moment of a shared machine hits both sides of the ratio it lands in (above 1
means the engine is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from clover_local import settings
from clover_local.engine.diffusion_engine import DiffusionEngine
from clover_local.engine.diffusion_schedule import Algorithm
from clover_local.engine.loader import load_engine
from clover_local.engine.types import ChatMessage
from clover_local.gguf.header import read_local_header
from clover_local.plan.diffusion import plan_diffusion
from clover_local.testing.models import TinySpec, tiny_model, tiny_model_from_spec
from clover_local.testing.settings import engine_settings
from tests.diffusion_cli import run_cli

PROMPT = "The capital of France is"
BIG_DREAM = TinySpec(
    kind="dream", n_layer=6, n_embd=256, n_head=8, head_dim=32, n_head_kv=4, n_ff=768, seed=11
)


def cli_run(
    cli: Path, model: Path, ub: int, steps: int, schedule: list[str], threads: int, seed: int
) -> tuple[str, float, float | None]:
    cmd = [
        str(cli), "-m", str(model), "-p", PROMPT, "-ub", str(ub), "-b", str(ub), "-c", str(ub),
        "-t", str(threads), "--temp", "0", "--seed", str(seed),
        "--diffusion-algorithm", str(int(Algorithm.CONFIDENCE)), "--diffusion-steps", str(steps), *schedule,
    ]  # fmt: skip
    run = run_cli(cmd, timeout_s=600)
    return run.text, run.seconds, run.sampling_s_per_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ub", type=int, default=128, help="canvas (prompt + answer) tokens")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path(".bench/diffusion.json"))
    args = parser.parse_args(argv)
    cli = settings.llama_server_dir() / "llama-diffusion-cli"
    if not cli.is_file():
        print(f"{cli} is missing: run scripts/build-llama-server", file=sys.stderr)
        return 1
    models = {
        "dream (tiny)": (tiny_model("dream"), ["--diffusion-eps", "0.001"], 0),
        "llada-moe (tiny)": (tiny_model("llada-moe"), ["--diffusion-block-length", "32"], 32),
        "dream (6x256)": (tiny_model_from_spec(BIG_DREAM), ["--diffusion-eps", "0.001"], 0),
    }
    report: dict[str, object] = {
        "threads": args.threads,
        "canvas": args.ub,
        "steps": args.steps,
        "models": {},
    }
    for label, (path, schedule, block) in models.items():
        plan, _ = plan_diffusion(read_local_header(path), ctx=args.ub)
        engine = load_engine(
            path, engine_settings(path, ctx=args.ub, threads=args.threads), diffusion=plan
        ).engine
        assert isinstance(engine, DiffusionEngine)
        runner = engine.runner
        # The cli renders the prompt with the GGUF's chat template (it has no switch to turn that off).
        prompt = engine.tokenize(
            engine.render_prompt((ChatMessage("user", PROMPT),)), add_special=True, parse_special=True
        )
        cli_s: list[float] = []
        eng_s: list[float] = []
        cli_other: list[float] = []
        eng_other: list[float] = []
        same = True
        for r in range(args.rounds):
            seed = 100 + r
            params = runner.params(
                max_length=args.ub, steps=args.steps, algorithm=Algorithm.CONFIDENCE,
                eps=0.0 if block else 0.001, block_length=block, temperature=0.0, seed=seed,
            )  # fmt: skip
            if r % 2:
                result = runner.generate(prompt, params)
                eng_s.append(result.seconds)
            text, seconds, sampling = cli_run(cli, path, args.ub, args.steps, schedule, args.threads, seed)
            cli_s.append(seconds)
            if sampling is not None:
                cli_other.append(sampling)
            if not r % 2:
                result = runner.generate(prompt, params)
                eng_s.append(result.seconds)
            eng_other.append((result.seconds - result.decode_seconds) / max(result.steps_run, 1))
            same &= engine.detokenize(result.tokens) == text
        engine.close()
        cli_med, eng_med = statistics.median(cli_s), statistics.median(eng_s)
        ratios = sorted(c / e for c, e in zip(cli_s, eng_s, strict=True))
        ratio = statistics.median(ratios)
        row = {
            "cli_s": round(cli_med, 4),
            "engine_s": round(eng_med, 4),
            "speed_ratio": round(ratio, 3),
            "speed_ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)],
            # Everything a step does besides decoding the canvas (sampling, unmasking), per step.
            "cli_other_ms_per_step": round(statistics.median(cli_other) * 1000, 3) if cli_other else None,
            "engine_other_ms_per_step": round(statistics.median(eng_other) * 1000, 3),
            "outputs_equal": same,
        }
        report["models"][label] = row  # type: ignore[index]
        print(f"{label:<18} cli {cli_med * 1000:8.1f} ms  engine {eng_med * 1000:8.1f} ms  "
              f"ratio {ratio:5.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})  equal {same}  "
              f"besides decoding: cli {row['cli_other_ms_per_step']} ms/step, "
              f"engine {row['engine_other_ms_per_step']} ms/step")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

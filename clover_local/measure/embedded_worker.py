"""One embedded-engine measurement in its own process (``python -m clover_local.measure.embedded_worker``), so
its GPU memory is its own in NVML and freed when it exits: load with the plan's settings, decode greedy and
sampled replies with and without self-speculation, print one JSON line.

It imports numpy *before* anything from llama.cpp on purpose: that order crashed the CUDA build once (issue 10),
and clover_local now loads llama.cpp's libraries first whatever the caller imported (``clover_local._native``).
"""

from __future__ import annotations

import json
import sys
import time

import numpy  # noqa: F401  # deliberately first: see the module docstring


def main(argv: list[str]) -> int:
    from clover_local.engine.loader import load_engine
    from clover_local.engine.types import Finished, GenerationRequest
    from clover_local.plan.types import SpeculativePlan

    job = json.loads(argv[0])
    raw = job["speculative"]
    spec = SpeculativePlan(**{**raw, "batch_costs": tuple(raw.get("batch_costs", ()))})
    t0 = time.perf_counter()
    loaded = load_engine(job["model"], job["settings"], chat_template="completion", speculative=spec)
    load_s = time.perf_counter() - t0
    engine = loaded.engine
    out: dict[str, object] = {"load_s": round(load_s, 2), "placement": loaded.placement}
    out["buffers"] = [ln for ln in loaded.load_log if "buffer size" in ln]
    runs = (
        ("greedy", 0.0, False, False),
        ("greedy_backend", 0.0, False, True),
        ("sampled", 0.7, False, False),
        ("sampled_backend", 0.7, False, True),
        ("greedy_spec", 0.0, True, False),
    )
    for name, temperature, speculative, backend in runs:
        engine.backend_sampling = backend
        rates = []
        for _ in range(2):
            request = GenerationRequest(
                prompt="The history of the city begins",
                max_tokens=128,
                temperature=temperature,
                top_k=20,
                top_p=0.8,
                seed=1,
                speculative=speculative,
            )
            stats = None
            for event in engine.generate(request):
                if isinstance(event, Finished):
                    stats = event.stats
            assert stats is not None
            engine.reset_cache()
            rates.append(stats.decode_tokens_per_s)
            out[f"{name}_tokens"] = stats.completion_tokens
            out[f"{name}_acceptance"] = stats.draft_acceptance
        out[name] = round(max(rates), 2)
    engine.close()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

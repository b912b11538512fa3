#!/usr/bin/env python3
"""Compare the engine's diffusion with llama.cpp's own ``diffusion_generate``, token for token, without the
``llama-diffusion-cli`` build: ``examples/diffusion/diffusion.cpp`` of the pinned source is compiled unmodified
(one translation unit, seconds) against llama-cpp-python's ``libllama``, with a two-line shim for ``common.h``
(``common_batch`` over ``llama_batch``, ``llama_process`` as ``llama_decode``) and ``log.h``.

    .venv/bin/python benchmarks/check_diffusion_reference.py --src /path/to/llama.cpp [--temperature 0.8]

Runs every algorithm on tiny random ``dream`` (timestep schedule) and ``llada-moe`` (block schedule) models with
two seeds; prints EQUAL or how many tokens differ, and times both (``total time`` of the C++, the runner's
loop) for the speed ratio. Needs g++. ``tests/test_diffusion_engine.py`` does the same against the real cli.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp

from clover_local.engine.diffusion_schedule import Algorithm
from clover_local.engine.loader import load_engine
from clover_local.engine.types import ChatMessage
from clover_local.gguf.header import read_local_header
from clover_local.plan.diffusion import plan_diffusion
from clover_local.testing.models import tiny_model
from clover_local.testing.settings import engine_settings

COMMON_SHIM = """#pragma once
#include "llama.h"
#include <vector>
struct common_batch {
    llama_batch b; int n = 0;
    common_batch(llama_context * ctx) { b = llama_batch_init(llama_n_batch(ctx), 0, 1); }
    void clear() { n = 0; }
    int add(llama_token id, llama_pos pos, llama_seq_id s, bool out) {
        b.token[n] = id; b.pos[n] = pos; b.n_seq_id[n] = 1; b.seq_id[n][0] = s; b.logits[n] = out; return n++;
    }
    llama_batch get() { b.n_tokens = n; return b; }
};
#define llama_process(ctx, type, batch) llama_decode(ctx, batch)
"""
LOG_SHIM = """#pragma once
#include <cstdio>
#define LOG_INF(...) fprintf(stderr, __VA_ARGS__)
#define LOG_ERR(...) fprintf(stderr, __VA_ARGS__)
"""
HARNESS = r"""
#include "diffusion.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>
int main(int argc, char ** argv) {
    // model tokens(csv) max_length steps algorithm eps block_length seed top_k top_p temp threads
    if (argc < 13) return 2;
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    int max_length = atoi(argv[3]);
    auto cp = llama_context_default_params();
    cp.n_ctx = max_length; cp.n_batch = max_length; cp.n_ubatch = max_length;
    llama_context * ctx = llama_init_from_model(model, cp);
    llama_set_n_threads(ctx, atoi(argv[12]), atoi(argv[12]));
    std::vector<llama_token> in; std::stringstream ss(argv[2]); std::string t;
    while (std::getline(ss, t, ',')) in.push_back(atoi(t.c_str()));
    diffusion_params p;
    char sl[8];
    p.shift_logits = llama_model_meta_val_str(model, "diffusion.shift_logits", sl, sizeof(sl)) >= 0 ? strcmp(sl, "true") == 0 : true;
    p.mask_token_id = llama_vocab_mask(llama_model_get_vocab(model));
    p.max_length = max_length; p.steps = atoi(argv[4]); p.algorithm = (diffusion_algorithm) atoi(argv[5]);
    p.eps = atof(argv[6]); p.block_length = atoi(argv[7]);
    p.schedule = p.block_length ? DIFFUSION_TRANSFER_SCHEDULE_BLOCK_BASED : DIFFUSION_TRANSFER_SCHEDULE_TIMESTEP_BASED;
    p.seed = atoi(argv[8]); p.top_k = atoi(argv[9]); p.top_p = atof(argv[10]); p.temperature = atof(argv[11]);
    std::vector<llama_token> out(max_length); int n = 0;
    diffusion_generate(ctx, in.data(), out.data(), in.size(), p, n);
    for (int i = in.size(); i < n; i++) printf("%d%s", out[i], i + 1 < n ? "," : "\n");
    return 0;
}
"""


def build(src: Path, out_dir: Path) -> Path:
    shim = out_dir / "shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "common.h").write_text(COMMON_SHIM)
    (shim / "log.h").write_text(LOG_SHIM)
    (out_dir / "harness.cpp").write_text(HARNESS)
    lib = Path(llama_cpp.__file__).resolve().parent / "lib"
    exe = out_dir / "diffusion-ref"
    cmd = ["g++", "-O2", "-std=c++17", f"-I{shim}", f"-I{src / 'include'}", f"-I{src / 'ggml/include'}"]
    cmd += [
        f"-I{src / 'examples/diffusion'}",
        str(out_dir / "harness.cpp"),
        str(src / "examples/diffusion/diffusion.cpp"),
    ]
    cmd += ["-o", str(exe), f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"]
    subprocess.run(cmd, check=True)
    return exe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--src", type=Path, required=True, help="the pinned llama.cpp source (vendor/llama.cpp)"
    )
    parser.add_argument("--canvas", type=int, default=96)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(args.src, Path(tmp))
        for kind, block in (("dream", 0), ("llada-moe", 32)):
            path = tiny_model(kind)
            plan, _ = plan_diffusion(read_local_header(path), ctx=args.canvas)
            engine = load_engine(
                path, engine_settings(path, ctx=args.canvas, threads=args.threads), diffusion=plan
            ).engine
            runner = engine.runner
            prompt = engine.tokenize(engine.render_prompt((ChatMessage("user", "The capital of France is"),)))
            ref_s: list[float] = []
            eng_s: list[float] = []
            for algorithm in Algorithm:
                for seed in (1234, 7):
                    cmd = [str(exe), str(path), ",".join(map(str, prompt)), str(args.canvas), str(args.steps)]
                    cmd += [
                        str(int(algorithm)),
                        "0" if block else "0.001",
                        str(block),
                        str(seed),
                        "40",
                        "0.95",
                    ]
                    cmd += [str(args.temperature), str(args.threads)]
                    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    ref = [int(x) for x in done.stdout.strip().split(",")]
                    ref_s.append(float(re.search(r"total time: ([0-9.]+)ms", done.stderr).group(1)) / 1000)  # type: ignore[union-attr]
                    params = runner.params(
                        max_length=args.canvas, steps=args.steps, algorithm=algorithm,
                        eps=0.0 if block else 0.001, block_length=block, temperature=args.temperature, seed=seed,
                    )  # fmt: skip
                    t0 = time.perf_counter()
                    got = runner.generate(prompt, params).tokens
                    eng_s.append(time.perf_counter() - t0)
                    differ = sum(a != b for a, b in zip(got, ref, strict=True))
                    failures += differ > 0
                    print(f"{kind:<10} {algorithm.name.lower():<11} seed {seed:<5} "
                          f"{'EQUAL' if not differ else f'DIFFER at {differ}/{len(ref)}'}")  # fmt: skip
            engine.close()
            ratio = statistics.median(ref_s) / statistics.median(eng_s)
            print(f"{kind}: C++ {statistics.median(ref_s) * 1000:.1f} ms, engine "
                  f"{statistics.median(eng_s) * 1000:.1f} ms (median per generation), speed ratio {ratio:.2f}")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

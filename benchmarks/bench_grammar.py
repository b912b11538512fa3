"""Constrained decoding speed, this tree beside another commit's (default 0df4f97, before issue 41) in one run.

SmolLM2 135M Instruct on the embedded engine, greedy: each schema is the request's ``response_format``, so each
tree's engine builds its grammar with its own converter. The schemas: ``tests/schema_corpus.py``'s shapes and
real-world ones from ``tests/data/schema_corpus/`` that both trees accept. Rounds alternate between the trees
(a busy machine slows both alike); the figure is each schema's median decode tokens/s, and the ratio
this tree / base (1.00: no change). Ratios, not absolute speeds, are what to read on a shared machine.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_grammar.py [--base 0df4f97] [--rounds 3] [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ASK = "Fill in an example. Keep every string short."


def _schemas(count: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.real_schemas import entries
    from tests.schema_corpus import CORPUS

    out: dict[str, Any] = {f"shape/{name}": schema for name, (schema, _good, _bad) in CORPUS.items()}
    real = sorted(entries(), key=lambda e: len(json.dumps(e.schema)))
    for origin in ("bfcl", "schemastore"):
        picked = [e for e in real if e.origin == origin and len(json.dumps(e.schema)) > 600][:count]
        out |= {e.name: e.schema for e in picked}
    return out


def _child(schemas_file: str, model: str, max_tokens: int) -> None:
    """One round of every schema on this process's ``clover_local`` (the tree on PYTHONPATH)."""
    from clover_local.engine.loader import load_engine
    from clover_local.engine.types import ChatMessage, Finished, GenerationRequest
    from clover_local.errors import RequestRefused
    from clover_local.testing.settings import engine_settings

    schemas = json.loads(Path(schemas_file).read_text())
    engine = load_engine(model, engine_settings(model, ctx=2048)).engine
    out: dict[str, Any] = {}
    for name, schema in schemas.items():
        request = GenerationRequest(
            messages=(ChatMessage("user", ASK),), json_schema=schema, max_tokens=max_tokens, temperature=0.0
        )
        try:
            stats = next(e.stats for e in engine.generate(request) if isinstance(e, Finished))
        except RequestRefused as exc:
            out[name] = {"refused": str(exc).splitlines()[0]}
            continue
        out[name] = {"tokens": stats.completion_tokens, "tokens_per_s": stats.decode_tokens_per_s}
    engine.close()
    print(json.dumps(out))


def _round(tree: Path, schemas_file: str, model: str, max_tokens: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    args = [sys.executable, str(Path(__file__).resolve()), "--child", schemas_file, model, str(max_tokens)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False, cwd=tree)
    if done.returncode:
        raise SystemExit(f"the benchmark in {tree} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="0df4f97")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--real", type=int, default=6, help="real-world schemas from each source")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from clover_local.testing.models import smollm2_path

    model = str(smollm2_path())
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(
            ["git", "archive", args.base, "clover_local"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        schemas_file = Path(tmp) / "schemas.json"
        schemas_file.write_text(json.dumps(_schemas(args.real)))
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "here": []}
        for _ in range(args.rounds):
            runs["base"].append(_round(base, str(schemas_file), model, args.max_tokens))
            runs["here"].append(_round(ROOT, str(schemas_file), model, args.max_tokens))
    print(f"| schema | tokens ({args.base} / this tree) | {args.base} tok/s | this tree tok/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    ratios = []
    for name in runs["here"][0]:
        if any("refused" in r[name] for side in runs.values() for r in side):
            why = runs["base"][0][name].get("refused") or runs["here"][0][name].get("refused")
            print(f"| {name} | refused by one tree: {why} | | | |")
            continue
        speed = {k: statistics.median(r[name]["tokens_per_s"] for r in v) for k, v in runs.items()}
        ratio = speed["here"] / speed["base"]
        ratios.append(ratio)
        tokens = f"{runs['base'][0][name]['tokens']} / {runs['here'][0][name]['tokens']}"
        print(f"| {name} | {tokens} | {speed['base']:.1f} | {speed['here']:.1f} | {ratio:.2f} |")
    if ratios:
        mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(
            f"\ngeometric mean ratio over {len(ratios)} schemas: {mean:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()

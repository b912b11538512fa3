"""The grammar engine's own cost per token, this tree's grammar beside another commit's (default 0df4f97), with
no model run: SmolLM2's vocabulary, llama.cpp's grammar sampler (``engine.sampling.GrammarGate``), and a valid
reply of each ``tests/schema_corpus.py`` shape fed token by token. Two figures a token: checking the pick
alone (what a greedy step costs when the pick fits) and masking the whole vocabulary (when it does not). Medians
of interleaved repeats, as ratios; far steadier than whole-decode speeds on a busy machine.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_grammar_steps.py [--base 0df4f97]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_OLD_GRAMMAR = (
    "import json, sys; from clover_local.engine.schema_gbnf import schema_grammar; "
    "print(schema_grammar(json.loads(sys.stdin.read())))"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="0df4f97")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import llama_cpp
    import numpy as np
    from llama_cpp import llama_cpp as C

    from clover_local.engine.sampling import GrammarGate
    from clover_local.engine.schema_gbnf import schema_grammar
    from clover_local.testing.models import smollm2_path
    from tests.schema_corpus import CORPUS

    llm = llama_cpp.Llama(model_path=str(smollm2_path()), vocab_only=True, verbose=False)
    vocab, n_vocab = C.llama_model_get_vocab(llm.model), llm.n_vocab()
    logits = np.zeros(n_vocab, dtype=np.float32)

    def run(gbnf: str, tokens: list[int], full: bool) -> float:
        gate = GrammarGate(vocab, n_vocab, gbnf)
        start = time.perf_counter()
        for token in tokens:
            if full:
                gate.masked(logits)
            else:
                gate.allows(token)
            gate.accept(token)
        gate.close()
        return time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.base, "clover_local"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        print(
            f"| shape | tokens | check the pick: this tree / {args.base} | mask the vocabulary: this tree / {args.base} |"
        )
        print("| --- | --- | --- | --- |")
        for name, (schema, good, _bad) in CORPUS.items():
            old = subprocess.run([sys.executable, "-c", _OLD_GRAMMAR], input=json.dumps(schema), capture_output=True,
                                 text=True, check=True, env={"PYTHONPATH": tmp}).stdout  # fmt: skip
            new = schema_grammar(schema)
            tokens = llm.tokenize(json.dumps(good[0], indent=1).encode(), add_bos=False)
            ratios = []
            for full, repeats in ((False, 30), (True, 5)):
                before, after = [], []
                for _ in range(repeats):
                    before.append(run(old, tokens, full))
                    after.append(run(new, tokens, full))
                ratios.append(statistics.median(after) / statistics.median(before))
            print(f"| {name} | {len(tokens)} | {ratios[0]:.2f} | {ratios[1]:.2f} |")


if __name__ == "__main__":
    main()

"""How the schema converter fares on the real-world corpus (``tests/data/schema_corpus/``): schemas enforced
and refused per source, refusals by keyword, and random sentences of each grammar that ``jsonschema`` refuses
(formats checked). Both engines: the embedded engine's grammar, and what the llama-server route sends.

    PYTHONPATH=. python benchmarks/schema_corpus_report.py [--samples 20] [--list]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clover_local.engine.schema_gbnf import schema_grammar
from clover_local.llamacpp.server_tools import schema_fields
from tests.real_schemas import convert, entries, violations


def _server_grammar(schema: dict[str, Any]) -> str:
    fields = schema_fields(schema)
    return str(fields.get("grammar", ""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--list", action="store_true", help="print each refusal and violation")
    args = parser.parse_args()
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    keywords: collections.Counter[str] = collections.Counter()
    bad = 0
    differ = 0
    upstream = 0
    corpus = entries()
    for entry in corpus:
        mine = convert(schema_grammar, entry.schema)
        theirs = convert(_server_grammar, entry.schema)
        if (mine.refusal is None) != (theirs.refusal is None) or (
            mine.refusal is not None
            and theirs.refusal is not None
            and (mine.refusal.keyword, mine.refusal.path) != (theirs.refusal.keyword, theirs.refusal.path)
        ):
            differ += 1
            if args.list:
                print(f"ROUTES DIFFER {entry.name}: {mine.refusal} / {theirs.refusal}")
        if theirs.grammar == "":
            upstream += 1
        if mine.refusal is not None:
            counts[entry.origin, "refused"] += 1
            keywords[mine.refusal.keyword] += 1
            if args.list:
                print(f"REFUSED {entry.name}: {mine.refusal}")
            continue
        counts[entry.origin, "enforced"] += 1
        assert mine.grammar is not None
        found = list(violations(mine.grammar, entry.schema, args.samples, seed=len(entry.name)))
        if found:
            bad += 1
            if args.list:
                print(f"VIOLATION {entry.name}: {found[0][1]}\n    {found[0][0][:300]!r}")
    print(f"{len(corpus)} schemas, {args.samples} sentences drawn from each grammar")
    for origin in sorted({o for o, _ in counts}):
        enforced, refused = counts[origin, "enforced"], counts[origin, "refused"]
        print(f"  {origin}: {enforced} enforced, {refused} refused ({refused / (enforced + refused):.1%})")
    total = sum(v for (_, k), v in counts.items() if k == "refused")
    print(f"  all: {total} refused ({total / len(corpus):.1%})")
    print("refusals by keyword:", ", ".join(f"{k} {n}" for k, n in keywords.most_common()))
    print(f"schemas with a sampled sentence the schema refuses: {bad}")
    print(
        f"schemas the two routes decide differently: {differ}; sent to llama-server's own converter: {upstream}"
    )


if __name__ == "__main__":
    main()

"""Which of the corpus's schemas (``tests/data/schema_corpus/``) llguidance's JSON Schema compiler accepts, as
it is configured by default: the coverage half of the decision on a token-mask backend (``docs/agents.md``).
llguidance is not a dependency; run this in a virtual environment of its own:

    python -m venv /tmp/lg && /tmp/lg/bin/pip install llguidance
    /tmp/lg/bin/python benchmarks/probe_llguidance.py
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "schema_corpus"


def main() -> None:
    import llguidance

    refused: collections.Counter[str] = collections.Counter()
    total = 0
    for path in sorted(DATA.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                entry = json.loads(line)
                total += 1
                grammar = llguidance.grammar_from("json_schema", json.dumps(entry["schema"]))
                failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
                if failed:
                    refused[(messages[0] if messages else "?").split(":")[0][:60]] += 1
    print(f"{total} schemas, {sum(refused.values())} refused by llguidance {llguidance.get_version()}")
    for why, count in refused.most_common(12):
        print(f"  {count:4d}  {why}")


if __name__ == "__main__":
    main()

"""Models for tests and benchmarks (the real Gemma 3 270M, tiny random GGUFs) and the memory measurement the
memory-model check runs. Not product code: excluded from the wheel (``pyproject.toml``); used by ``tests/`` and
``scripts/`` in a checkout."""

"""What tests and benchmarks share: models (the real Gemma 3 270M, tiny random GGUFs, the Clover-shaped writer),
the settings to load a file directly, the test runtime's recipe, the memory measurements the memory-model check and
its tests run, and the speculation workloads. Not product code: excluded from the wheel (``pyproject.toml``), and
no module of ``clover_local`` outside it imports it (``tests/test_layering.py``); used by ``tests/``,
``benchmarks/`` and ``scripts/``'s model builders in a checkout. A module only benchmarks use lives in
``benchmarks/``."""

"""Serving: the OpenAI-compatible HTTP API over any engine (the embedded one, or an upstream llama-server run
through :mod:`clover_local.llamacpp`)."""

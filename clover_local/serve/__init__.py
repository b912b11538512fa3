"""Serving: an OpenAI-compatible HTTP API over the embedded engine, and upstream llama-server processes."""

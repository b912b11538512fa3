"""The embedded engine: llama-cpp-python in-process, with self-speculative decoding."""

"""Upstream llama.cpp runtimes installed side by side with the pinned build: what is installed
(:mod:`.installed`), the releases API and its assets, downloading, verifying and installing them."""

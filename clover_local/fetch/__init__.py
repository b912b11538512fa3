"""Fetching GGUFs from Hugging Face: resolve files for a quant, download with resume, verify."""

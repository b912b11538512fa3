"""Measuring on this machine: llama-bench runs recorded for the planner, and the GPU check (plan vs real)."""

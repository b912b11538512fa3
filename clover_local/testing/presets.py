"""User-preset TOML for the tiny qwen35moe test model (Clover's architecture at toy sizes), for tests that put a
preset and its repo on the fake Hub."""

from __future__ import annotations

from collections.abc import Mapping

TINY_QWEN35MOE_ARCHITECTURE = """\
arch = "qwen35moe"
n_layers = 8
full_attention_interval = 4
n_head_kv = 2
head_dim = 64
n_embd = 128
n_vocab = 824
n_ctx_train = 4096
n_expert = 8
n_expert_used = 2
n_expert_shared = 1
expert_ffn = 64
recurrent_state_bytes = 116_736
"""
"""The ``[architecture]`` of ``tiny_model("qwen35moe")`` as a preset states it."""


def tiny_qwen35moe_preset(
    name: str,
    repo: str,
    quants: Mapping[str, int],
    *,
    default_quant: str = "auto",
    extra_architecture: str = "",
) -> str:
    """A preset TOML named ``name`` for ``repo``: one ``[quants.Q]`` per entry (pattern ``Q``, the value as its
    ``fallback_bytes``), the tiny model's architecture (plus ``extra_architecture`` lines), context 2048 of 4096."""
    quant_tables = "".join(
        f'\n[quants.{q}]\npattern = "{q}"\nfallback_bytes = {size}\n' for q, size in quants.items()
    )
    return (
        f'name = "{name}"\ndisplay_name = "{name} (test)"\nrepo = "{repo}"\ndefault_quant = "{default_quant}"\n'
        f"{quant_tables}\n[architecture]\n{TINY_QWEN35MOE_ARCHITECTURE}{extra_architecture}"
        "\n[context]\ndefault = 2048\nmax = 4096\n"
    )

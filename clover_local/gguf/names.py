"""The names llama.cpp gives tensors and split files, as regular expressions: one copy of each.

- :data:`FFN_EXPS_REGEX`: the routed-expert FFN tensors, ``LLM_FFN_EXPS_REGEX`` in ``common/common.h``
  (``ffn_up_exps``, ``ffn_gate_up_exps``, and the ``chexps`` variant); what ``--n-cpu-moe`` / ``--cpu-moe``
  keep in RAM.
- :data:`LAYER_RE`: the block index of a ``blk.N.*`` tensor.
- :data:`SHARD_RE`: a split GGUF's file name, ``NAME-00001-of-00003.gguf`` (``gguf-split``'s naming).
- :data:`DRAFT_KINDS`: the drafter heads that come as sidecar files (``mtp-``, ``dspark-``...).
"""

from __future__ import annotations

import re
from typing import Literal

FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
"""``LLM_FFN_EXPS_REGEX`` in ``common/common.h``, as llama.cpp matches it (``std::regex_search``)."""
FFN_EXPS_RE = re.compile(FFN_EXPS_REGEX)
LAYER_RE = re.compile(r"^blk\.(\d+)\.")
"""``blk.<N>.``: the tensor belongs to block (layer) N."""
SHARD_RE = re.compile(r"^(?P<base>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
"""``<base>-<index>-of-<count>.gguf``: one shard of a split GGUF (1-based index)."""


DraftKind = Literal["mtp", "dspark", "dflash", "eagle3"]
"""Drafter heads for self-speculative decoding that come as files (``fetch.sidecars`` tells them apart)."""

DRAFT_KINDS: tuple[DraftKind, ...] = ("mtp", "dspark", "dflash", "eagle3")
"""Drafter sidecars, in the order llama.cpp prefers them when it infers a type (``common/arg.cpp``)."""

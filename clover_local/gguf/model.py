"""A model as the planner sees it: architecture numbers plus, when a GGUF header was read (local,
:mod:`clover_local.gguf.header`, or remote, :mod:`clover_local.fetch.remote_header`), exact bytes per tensor;
from a preset alone, sizes estimated from its fallback bytes."""

from __future__ import annotations

from dataclasses import dataclass

from clover_local.gguf.names import FFN_EXPS_RE, LAYER_RE
from clover_local.presets import Architecture, Preset


@dataclass(frozen=True)
class TensorEntry:
    name: str
    n_bytes: int
    layer: int | None
    """Block index for ``blk.N.*`` tensors, None for embeddings, output and norms."""
    is_expert: bool
    """Routed-expert FFN tensor (``ffn_*_exps``): what ``--n-cpu-moe`` keeps in RAM."""
    ggml_type: str = ""
    """Its ggml type as the header names it (``Q4_K``, ``F16``): what :mod:`clover_local.gguf.loadable` checks."""

    @staticmethod
    def classify(name: str, n_bytes: int, ggml_type: str = "") -> TensorEntry:
        m = LAYER_RE.match(name)
        layer = int(m.group(1)) if m else None
        return TensorEntry(name, n_bytes, layer, bool(FFN_EXPS_RE.search(name)), ggml_type)


@dataclass(frozen=True)
class DiffusionHeader:
    """What a diffusion GGUF's header says about decoding it (``llama_model_is_diffusion`` architectures)."""

    shift_logits: bool = True
    """``diffusion.shift_logits``; llama.cpp's cli takes true when the key is absent (Dream)."""
    shift_logits_in_header: bool = False
    mask_token_id: int | None = None
    """``tokenizer.ggml.mask_token_id``: the token the answer starts as."""


@dataclass(frozen=True)
class ModelDescription:
    architecture: Architecture
    file_bytes: int
    """All shards together."""
    quant: str | None = None
    tensors: tuple[TensorEntry, ...] | None = None
    """None when only a preset was known: sizes below are then estimates."""
    chat_template: str | None = None
    """The template stored in the GGUF (``tokenizer.chat_template``), if any."""
    source: str = ""
    diffusion: DiffusionHeader | None = None
    """Set when the architecture decodes by diffusion: the whole canvas is one batch, there is no KV cache."""
    name: str | None = None
    """The model's own name (``general.name`` in the GGUF header), if it gives one."""

    @property
    def exact(self) -> bool:
        return self.tensors is not None

    def expert_bytes_per_layer(self) -> list[int]:
        """Routed-expert bytes of each layer."""
        n = self.architecture.n_layers
        if self.tensors is None:
            per = int(self.file_bytes * self.architecture.expert_weight_fraction) // n
            return [per] * n
        return self._per_layer(expert=True)

    def dense_bytes_per_layer(self) -> list[int]:
        """Non-expert bytes of each layer: attention or recurrent weights, shared expert, norms, router."""
        n = self.architecture.n_layers
        if self.tensors is None:
            rest = self.file_bytes - sum(self.expert_bytes_per_layer()) - self.global_bytes()
            return [max(rest, 0) // n] * n
        return self._per_layer(expert=False)

    def _per_layer(self, *, expert: bool) -> list[int]:
        out = [0] * self.architecture.n_layers
        for t in self.tensors or ():
            if t.is_expert == expert and t.layer is not None and t.layer < len(out):
                out[t.layer] += t.n_bytes
        return out

    def global_bytes(self) -> int:
        """Bytes outside the layers: token embedding, output head, final norm."""
        if self.tensors is None:
            a = self.architecture
            # Embedding and output head at roughly the file's average bits per weight.
            return min(self.file_bytes // 10, 2 * a.n_vocab * a.n_embd * 2 // 3)
        return sum(t.n_bytes for t in self.tensors if t.layer is None)

    def tensor_bytes(self, name: str) -> int:
        """Bytes of one named tensor (0 when unknown)."""
        for t in self.tensors or ():
            if t.name == name:
                return t.n_bytes
        return 0


def describe_from_preset(preset: Preset, quant: str, file_bytes: int | None = None) -> ModelDescription:
    """A model description from the preset alone (no header): sizes are estimates. Whether it decodes by
    diffusion is the preset's word, else the pinned llama.cpp's list (packaged: no file or process is asked, so
    the planner that calls this stays pure)."""
    from clover_local.arch_support import is_diffusion_arch

    spec = preset.quants[quant]
    diffusion = preset.decoding == "diffusion" or (
        preset.decoding == "auto" and is_diffusion_arch(preset.architecture.arch)
    )
    return ModelDescription(
        diffusion=DiffusionHeader() if diffusion else None,
        architecture=preset.architecture,
        file_bytes=file_bytes or spec.fallback_bytes,
        quant=quant,
        source=f"preset {preset.name}",
    )

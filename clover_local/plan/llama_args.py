"""The one place a plan becomes llama.cpp settings: argv for upstream ``llama-server`` and keyword arguments for
``llama_cpp.Llama`` come from the same table (:func:`settings`), row by row, so the two cannot disagree.

Flag names are those of ``common/arg.cpp`` at the vendored llama.cpp commit (0c1e570); a test parses that file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clover_local.gguf.names import FFN_EXPS_REGEX
from clover_local.plan.memory import rollback_snapshots
from clover_local.plan.threads import binding_flags
from clover_local.plan.types import Plan
from clover_local.presets import TEMPLATE_COMPLETION, TEMPLATE_FROM_GGUF

GGML_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}
"""ggml type ids (``ggml.h``) for ``type_k``/``type_v``."""
SPLIT_MODES: dict[str, int] = {"none": 0, "layer": 1, "row": 2}
"""``LLAMA_SPLIT_MODE_*``."""
MMAP_MLOCK: dict[str, tuple[bool, bool]] = {
    "auto": (True, False),
    "mmap": (True, False),
    "none": (False, False),
    "mlock": (False, True),
    "mmap+mlock": (True, True),
}
"""Load mode -> (use_mmap, use_mlock), as ``Llama.__init__`` maps them back onto ``llama_load_mode``."""


@dataclass(frozen=True)
class Setting:
    """One row: what ``llama-server`` gets (``flag`` + ``value``; None: no flag) and what ``Llama()`` gets
    (``kwarg`` = ``kwarg_value``; None: not a keyword of ``Llama.__init__``)."""

    flag: str | None
    value: str | None
    kwarg: str | None
    kwarg_value: Any = None


def n_cpu_moe_overrides(n: int) -> list[str]:
    """``--n-cpu-moe N`` as llama.cpp expands it (``llm_add_n_cpu_ffn_overrides``): one ``<regex>=CPU`` per layer."""
    return [f"blk\\.{i}{FFN_EXPS_REGEX}=CPU" for i in range(n)]


def settings(plan: Plan) -> list[Setting]:
    """Every llama.cpp setting the plan decides, once."""
    use_mmap, use_mlock = MMAP_MLOCK[plan.load_mode]
    rows: list[Setting] = []
    if plan.rpc_servers:
        # Devices lent by other machines (tools/rpc); llama-cpp-python's wheel has no RPC backend, so no kwarg:
        # the engines refuse such a plan on the embedded engine.
        rows.append(Setting("--rpc", ",".join(plan.rpc_servers), None))
    if plan.model_path:
        rows.append(Setting("-m", plan.model_path, "model_path", plan.model_path))
    n_ctx = plan.ctx * plan.parallel  # llama.cpp splits -c evenly between the slots (n_ctx_seq)
    n_batch, n_ubatch = batch_sizes(plan)
    ngl = -1 if plan.n_gpu_layers < 0 else plan.n_gpu_layers
    head_ot = list(plan.speculative.head_overrides) if plan.speculative.enabled else []
    moe = str(plan.n_cpu_moe) if plan.n_cpu_moe > 0 else None
    overrides = n_cpu_moe_overrides(plan.n_cpu_moe) + head_ot  # the trunk's experts, then a head's
    rows += [
        Setting("-c", str(n_ctx), "n_ctx", n_ctx),
        # llama-server: -1 means "auto" (fit), "all" offloads every layer; llama-cpp-python: -1 means all.
        Setting("-ngl", "all" if ngl < 0 else str(ngl), "n_gpu_layers", ngl),
        Setting("--n-cpu-moe" if moe else None, moe, "tensor_buft_overrides", overrides),
    ]
    if head_ot:  # an embedded MTP head's experts stay in RAM with the trunk's
        rows.append(Setting("-ot", ",".join(head_ot), None))
    # llama-cpp-python has no "auto": the planner only decides on or off; auto maps to on (llama.cpp's auto
    # turns it on wherever the backend supports it, which every backend at this commit does).
    rows.append(Setting("-fa", plan.flash_attn, "flash_attn", plan.flash_attn != "off"))
    rows += [
        Setting("-ctk", plan.cache_type_k, "type_k", GGML_TYPES[plan.cache_type_k]),
        Setting("-ctv", plan.cache_type_v, "type_v", GGML_TYPES[plan.cache_type_v]),
        Setting("-t", str(plan.threads), "n_threads", plan.threads),
        # The embedded engine takes these as the most and follows the load between steps (engine.batch_threads);
        # llama-server's are picked by the load measured while probing and changed by a relaunch between
        # requests (llamacpp.load_follow), and it batches on its decode threads: a batch on cores another program wants collapses (0.07 of its idle
        # speed, benchmarks/bench_contention.py --batches, docs/reliability-general.md).
        Setting("-tb", str(plan.threads), "n_threads_batch", plan.threads_batch),
        # llama-server's threads on one core each (plan.threads.bound); llama-cpp-python has no such keyword.
        *_flag_rows(binding_flags(plan.threads, plan.core_cpus)),
        Setting("-b", str(n_batch), "n_batch", n_batch),
        Setting("-ub", str(n_ubatch), "n_ubatch", n_ubatch),
        Setting("--load-mode", plan.load_mode, "use_mmap", use_mmap),
        Setting(None, None, "use_mlock", use_mlock),
        # The planned slots (plan.slots): KV cells, recurrent state and checkpoints are sized for them. Never
        # llama-server's default (-1 = 4 slots, unified KV), which the plan did not size.
        Setting("-np", str(plan.parallel), "n_seq_max", plan.parallel),
        # One KV stream per slot (each holds its own ctx cells), as plan.memory counts them; pinned, since
        # llama-server's auto slots would turn unified on.
        Setting("--no-kv-unified" if plan.parallel > 1 else None, None, "kv_unified", False),
        # llama-server defaults to swa_full off, llama_context_default_params() to on: pin the server's.
        Setting(None, None, "swa_full", False),
        # The KV cache lives with its layer on the GPU (llama-server's default; -nkvo would turn it off).
        Setting(None, None, "offload_kqv", True),
    ]
    if not plan.repack:
        rows.append(Setting("--no-repack", None, "use_extra_bufts", False))  # plan.threads.cpu_repack
    if len(plan.tensor_split) > 1:
        rows += [
            Setting("-sm", plan.split_mode, "split_mode", SPLIT_MODES[plan.split_mode]),
            Setting(
                "-ts", ",".join(f"{s:g}" for s in plan.tensor_split), "tensor_split", list(plan.tensor_split)
            ),
            Setting("-mg", str(plan.main_gpu), "main_gpu", plan.main_gpu),
        ]
    else:
        rows += [
            Setting(None, None, "split_mode", SPLIT_MODES[plan.split_mode]),
            Setting(None, None, "main_gpu", plan.main_gpu),
            Setting(None, None, "tensor_split", None),
        ]
    if plan.chat_template not in (TEMPLATE_FROM_GGUF, TEMPLATE_COMPLETION):
        rows.append(Setting("--chat-template", plan.chat_template, "chat_format", plan.chat_template))
        # With Jinja on (the default at this commit) --chat-template takes its value as Jinja source, so a
        # built-in name like "gemma" would become the template text itself; built-in names need --no-jinja.
        rows.append(Setting("--no-jinja", None, None))
    if plan.ctx_checkpoints:  # per slot, counted in RAM by plan.memory.checkpoint_bytes; engine.checkpoints
        n = plan.ctx_checkpoints
        rows.append(Setting("--ctx-checkpoints", str(n), "ctx_checkpoints", n))
    if plan.diffusion is None:
        # llama-server's prompt cache, sized by the plan (0 turns it off); never its 8 GiB default, which grows
        # into RAM no plan counted. The embedded engine has no such cache.
        rows.append(Setting("--cache-ram", str(plan.prompt_cache_mib), None))
    rows += _engine_rows(plan)
    rows += _speculation_rows(plan)
    # --fit (default on at this commit) re-fits every parameter still at its default to free device memory, and
    # may add its own tensor overrides or shrink the context; the plan has already decided all of that, so fitting
    # again could only make llama-server disagree with the embedded engine.
    rows.append(Setting("--fit", "off", None))
    return rows


def batch_sizes(plan: Plan) -> tuple[int, int]:
    """(n_batch, n_ubatch): the plan's, except that a recurrent or hybrid model that rolls drafts back through
    llama.cpp's snapshots (an MTP head's) verifies a whole draft (up to ``n_max + 1`` tokens, and one more) in one
    ubatch, so its recurrent state is stepped once and each drafted token's snapshot can be rolled back to. An
    n-gram draft is rolled back from a copy of the state, whatever the ubatches."""
    n_batch, n_ubatch = plan.n_batch, plan.n_ubatch
    if plan.recurrent and rollback_snapshots(plan.speculative):
        n_ubatch = max(n_ubatch, plan.speculative.n_max + 2)
        n_batch = max(n_batch, n_ubatch)
    return n_batch, n_ubatch


def _flag_rows(flags: list[str]) -> list[Setting]:
    """``[flag, value, flag, value...]`` as argv-only settings."""
    return [Setting(flag, value, None) for flag, value in zip(flags[::2], flags[1::2], strict=True)]


def _engine_rows(plan: Plan) -> list[Setting]:
    """Settings only the embedded engine takes (no argv: llama-server decides each itself, or has no such
    setting). The embedded loader applies them as given."""
    spec = plan.speculative
    return [
        # Recurrent-state snapshots per sequence, one per token an MTP head drafts, so a rejected draft can be
        # rolled back (plan.memory.recurrent_copies counts them); none for n-gram drafts, rolled back from a copy
        # of the state (engine.checkpoints.DraftRollback). llama-server asks for its own (need_n_rs_seq).
        Setting(None, None, "n_rs_seq", rollback_snapshots(spec) if plan.recurrent else 0),
        # A verification batch has up to n_max + 1 outputs per sequence: backend sampling needs room for each
        # (llama_context_default_params: 1).
        Setting(None, None, "n_outputs_max_per_seq", spec.n_max + 1 if spec.enabled else 1),
        # Sampled replies on a GPU: the sampler chain in llama.cpp's graph, measured 206 vs 170 tokens/s on an
        # H200 (the host chain sorts 248K logits per token). CPU plans keep the host chain (a shortlist).
        # llama-server's -bs is experimental at this commit and unmeasured here, so it is not passed.
        Setting(None, None, "backend_sampling", plan.n_gpu_layers != 0),
    ]


def _speculation_rows(plan: Plan) -> list[Setting]:
    """``--spec-type`` and its flags (``plan.speculation`` chose the mode). The embedded engine drafts itself
    from ``plan.speculative``; llama-cpp-python has no keyword for any of these, except loading an MTP head."""
    spec = plan.speculative
    if not spec.enabled:
        return []
    if spec.type == "ngram-mod":
        return [
            Setting("--spec-type", spec.type, None),
            Setting("--spec-ngram-mod-n-match", str(spec.n_match), None),
            Setting("--spec-ngram-mod-n-min", str(spec.n_min), None),
            Setting("--spec-ngram-mod-n-max", str(spec.n_max), None),
        ]
    rows = [
        Setting("--spec-type", spec.type, None),
        Setting("--spec-draft-n-max", str(spec.draft_n_max), None),
    ]
    if spec.head == "sidecar" and spec.sidecar:
        rows += [
            Setting("-md", spec.sidecar, None),
            # A second model: place it like the trunk (all on the GPU(s), or none on a CPU plan) ...
            Setting("-ngld", "0" if plan.n_gpu_layers == 0 else "all", None),
            # ... with its KV cache in the trunk's type (llama.cpp's draft default is f16 whatever -ctk says).
            Setting("-ctkd", plan.cache_type_k, None),
            Setting("-ctvd", plan.cache_type_v, None),
        ]
        if spec.head_experts_in_ram:
            rows.append(Setting("-cmoed", None, None))
    return rows


@dataclass(frozen=True)
class LlamaSettings:
    """A plan's llama.cpp settings, rendered once (:func:`llama_settings`): what a launch carries, and both
    engines load from it, so the command shown is the one that runs."""

    rows: tuple[Setting, ...]
    model_path: str | None
    quant: str

    def argv(self, *, hf_repo: str | None = None) -> list[str]:
        """argv for upstream ``llama-server`` (without the binary). The model is ``-m PATH`` when the plan knows
        the local file, else ``-hf REPO:QUANT`` when ``hf_repo`` is given (the server then fetches it from
        Hugging Face itself), else left out."""
        argv: list[str] = []
        if not self.model_path and hf_repo:
            argv += hf_args(hf_repo, self.quant)
        for row in self.rows:
            if row.flag is not None:
                argv.append(row.flag)
                if row.value is not None:
                    argv.append(row.value)
        return argv

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``llama_cpp.Llama(**kwargs)``, plus ``tensor_buft_overrides`` (``"<regex>=CPU"``
        strings), ``n_seq_max`` and ``kv_unified`` (the slots), which the embedded engine sets through ctypes; pop
        them before calling ``Llama``."""
        return {row.kwarg: row.kwarg_value for row in self.rows if row.kwarg is not None}


def hf_args(repo: str, quant: str) -> list[str]:
    """``-hf REPO:QUANT``: llama-server fetches the model itself. ``--no-mmproj`` with it: ``-hf`` also fetches
    and loads a repo's multimodal projector by default, which the plan holds no memory for."""
    return ["-hf", f"{repo}:{quant}", "--no-mmproj"]


def llama_settings(plan: Plan) -> LlamaSettings:
    """The plan's settings as one value (the sole producer of llama.cpp settings)."""
    return LlamaSettings(tuple(settings(plan)), plan.model_path, plan.quant)


def llama_server_args(plan: Plan, *, hf_repo: str | None = None) -> list[str]:
    """argv for upstream ``llama-server`` (without the binary): :meth:`LlamaSettings.argv` of the plan."""
    return llama_settings(plan).argv(hf_repo=hf_repo)


def llama_cpp_kwargs(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for the embedded engine: :meth:`LlamaSettings.kwargs` of the plan."""
    return llama_settings(plan).kwargs()

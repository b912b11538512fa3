"""Pure parts of the embedded engine: text streaming with stop strings, n-gram drafting, draft-length control,
template choice and the sandbox, safer retry settings, placement summary. No model needed."""

from __future__ import annotations

import pytest

from clover_local.engine.drafter import DraftController, NgramDrafter
from clover_local.engine.loader import placement_summary
from clover_local.engine.templates import choose_template, render_completion, render_jinja
from clover_local.engine.textstream import StopTextStream
from clover_local.engine.types import ChatMessage
from clover_local.errors import EngineError
from clover_local.plan.verify_cost import batch_costs, distinct_experts


def test_stream_never_splits_a_utf8_character() -> None:
    stream = StopTextStream()
    data = "héllo €".encode()
    shown = [stream.push(data[i : i + 1]) for i in range(len(data))]
    assert "".join(shown) + stream.flush() == "héllo €"
    assert all("\ufffd" not in s for s in shown)


def test_stop_string_across_pieces_is_never_shown() -> None:
    stream = StopTextStream(stop=("</end>",))
    shown = "".join(stream.push(p.encode()) for p in ["abc <", "/e", "nd> more"])
    assert shown == "abc "
    assert stream.stopped
    assert stream.push(b"later") == ""


def test_held_back_prefix_is_released_when_it_does_not_complete() -> None:
    stream = StopTextStream(stop=("STOP",))
    assert stream.push(b"go ST") == "go "
    assert stream.push(b"ART") == "START"
    assert stream.push(b" ST") == " "
    assert stream.flush() == "ST"


def test_drafter_continues_the_latest_earlier_occurrence() -> None:
    d = NgramDrafter(match_sizes=(3, 2))
    d.extend([1, 2, 3, 4, 5, 6, 9, 1, 2, 3])
    assert d.draft(3) == [4, 5, 6]
    # Past the end, the copy goes on over its own guess: the pattern repeats (as chained lookups draft it).
    assert d.draft(10) == [4, 5, 6, 9, 1, 2, 3, 4, 5, 6]


def test_drafter_drafts_a_repeating_line_to_the_full_length() -> None:
    """A line repeated in the reply (period 3 here) matches its previous copy, a few tokens back; the draft is
    not cut where the sequence ends but continues the period, so verification batches stay long."""
    d = NgramDrafter(match_sizes=(4, 2))
    d.extend([9, 8, 1, 2, 3, 1, 2, 3, 1, 2, 3])
    assert d.draft(8) == [1, 2, 3, 1, 2, 3, 1, 2]
    assert d.last_match == 4


def test_drafter_prefers_the_longest_match() -> None:
    d = NgramDrafter(match_sizes=(3, 1))
    # "7" was followed by 8 most recently, but "5 6 7" was followed by 1.
    d.extend([5, 6, 7, 1, 7, 8, 5, 6, 7])
    assert d.draft(1) == [1]


def test_drafter_without_match_drafts_nothing() -> None:
    d = NgramDrafter(match_sizes=(2,))
    d.extend([1, 2, 3, 4])
    assert d.draft(4) == []
    assert d.draft(0) == []


def test_controller_drafts_long_when_guesses_are_right_and_verification_is_cheap() -> None:
    c = DraftController(n_min=2, n_max=16, costs=batch_costs(n_max_batch=17, on_gpu=True))
    for _ in range(5):
        c.record(16, 16, match_size=12)
    assert c.choose(16, match_size=12) >= 12
    assert c.choose(1, match_size=12) == 0  # fewer than n_min available
    assert c.acceptance == 1.0


def test_controller_stops_drafting_where_it_does_not_pay_and_probes_less_often() -> None:
    c = DraftController(n_min=2, n_max=16, costs=batch_costs(n_max_batch=17, on_gpu=False))
    c.record(2, 0, match_size=2)  # one wrong draft: 1.4 steps lost, most of the starting budget
    choices = []
    for _ in range(300):
        k = c.choose(8, match_size=2)
        choices.append(k)
        if k:
            c.record(k, 0, match_size=2)  # every probe wrong too
    probes = [i for i, k in enumerate(choices) if k]
    assert probes and len(probes) <= 3  # probes only as the budget allows, ever rarer
    assert {choices[i] for i in probes} == {2}  # the shortest draft: a wrong probe wastes the least
    assert c.acceptance == 0.0
    for _ in range(3):
        c.record(8, 8, match_size=12)
    assert c.choose(8, match_size=12) > 0  # a long match has its own estimate: drafting pays there
    assert c.choose(8, match_size=2) == 0


@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize("match_size", [2, 6, 12])
def test_speculation_never_loses_more_than_its_budget_on_a_reply_with_nothing_to_copy(
    on_gpu: bool, match_size: int
) -> None:
    """Every drafted token wrong, whatever the prior promised: by the cost model, drafting never loses more
    than the starting budget and 3% of the steps so far (issue 28: at least 0.97x of plain decoding)."""
    c = DraftController(n_min=2, n_max=16, costs=batch_costs(n_max_batch=17, on_gpu=on_gpu))
    for _ in range(500):
        k = c.choose(16, match_size=match_size)
        if k:
            c.record(k, 0, match_size=match_size)
        assert -c.saved <= c.START_BUDGET + c.LOSS_BUDGET * c.seen + 1e-9
    assert -c.saved <= c.START_BUDGET + 0.03 * 500


def test_a_copy_earns_longer_drafts_as_it_pays_back() -> None:
    c = DraftController(n_min=2, n_max=16, costs=batch_costs(n_max_batch=17, on_gpu=False))
    lengths = []
    for _ in range(12):
        k = c.choose(16, match_size=12)
        lengths.append(k)
        c.record(k, k, match_size=12)
    assert lengths[0] == 2 and lengths[-1] == 16 and lengths == sorted(lengths)


def test_controller_decides_from_tokens_alone_so_two_runs_draft_alike() -> None:
    """No timing goes in: the same accept/reject history gives the same decisions, on any machine load."""
    costs = batch_costs(n_max_batch=17, on_gpu=False)
    history = [(4, 4, 6), (6, 2, 3), (2, 0, 2), (8, 8, 12), (5, 1, 6)]

    def run() -> list[int]:
        c = DraftController(n_min=2, n_max=16, costs=costs)
        out = []
        for drafted, accepted, size in history:
            out.append(c.choose(12, match_size=size))
            c.record(drafted, accepted, match_size=size)
        return out

    assert run() == run()


def test_moe_verification_reads_more_experts_so_drafting_needs_better_guesses() -> None:
    """Clover's shape: 8 of 256 experts per token. A batch of 8 touches ~7.5x the experts of one token, so a
    draft that pays on a dense model does not pay there at the prior's 60% acceptance."""
    assert distinct_experts(256, 8, 1) == pytest.approx(8)
    assert distinct_experts(256, 8, 8) == pytest.approx(256 * (1 - (248 / 256) ** 8))
    moe = batch_costs(
        n_max_batch=17, on_gpu=True, dense_bytes=1.0, expert_bytes=1.0, n_expert=256, n_expert_used=8
    )
    dense = batch_costs(n_max_batch=17, on_gpu=True)
    assert moe[0] == dense[0] == 1.0
    assert moe[7] > 3 * dense[7]  # half the bytes read ~7.5 times over
    assert DraftController(2, 16, dense).choose(16, match_size=3) > 0
    assert DraftController(2, 16, moe).choose(16, match_size=3) == 0
    sure = DraftController(2, 16, moe)
    for _ in range(20):
        sure.record(8, 8, match_size=12)
    assert sure.choose(16, match_size=12) >= 4  # a copy the model keeps agreeing with still pays


def test_gguf_without_template_falls_back_to_completion_with_a_notice() -> None:
    choice = choose_template("gguf", None, ["chatml", "gemma"])
    assert choice.kind == "completion"
    assert choice.notice and "no chat template" in choice.notice


def test_unknown_builtin_template_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="Unknown chat template 'nonesuch'"):
        choose_template("nonesuch", None, ["chatml", "gemma"])


def test_jinja_template_renders_messages_and_generation_prompt() -> None:
    src = (
        "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    msgs = [ChatMessage("system", "be brief"), ChatMessage("user", "hi")]
    out = render_jinja(src, msgs, bos_token="<s>", eos_token="</s>")
    assert out == "<s><|system|>be brief\n<|user|>hi\n<|assistant|>"


def test_jinja_raise_exception_becomes_an_engine_error() -> None:
    src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    with pytest.raises(EngineError, match="first must be user"):
        render_jinja(src, [ChatMessage("system", "x")], bos_token="", eos_token="")


def test_jinja_sandbox_blocks_python_internals() -> None:
    src = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(EngineError, match="unsafe"):
        render_jinja(src, [ChatMessage("user", "x")], bos_token="", eos_token="")


def test_completion_template_joins_contents() -> None:
    assert render_completion([ChatMessage("system", "a"), ChatMessage("user", "b")]) == "a\n\nb"


def test_placement_summary_reads_llama_cpp_buffer_lines() -> None:
    lines = [
        "load_tensors:   CPU_Mapped model buffer size =   235.00 MiB",
        "load_tensors:        CUDA0 model buffer size =  1024.50 MiB",
        "load_tensors: offloaded 10/19 layers to GPU",
        "tensor blk.0.ffn_up_exps.weight (0 MiB f16) buffer type overridden to CPU",
        "llama_kv_cache:        CPU KV buffer size =    72.00 MiB",
    ]
    text = placement_summary(lines)
    assert "weights: CPU_Mapped 235 MiB, CUDA0 1024 MiB" in text
    assert "KV cache: CPU 72 MiB" in text
    assert "10/19 layers on GPU" in text
    assert "1 expert tensors kept in RAM" in text

"""What verifying a draft costs, measured once on this machine by the engine and then used as a fixed number."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from clover_local.engine.verify_probe import costs_from_times, measured_quietly, probe_sizes
from clover_local.measure.records import add_verify_costs, load_verify_costs, verify_costs_path
from clover_local.plan.measured import VerifyCostRecord, measured_verify_costs


def test_a_probe_is_quiet_only_when_the_load_leaves_its_threads_every_core() -> None:
    assert measured_quietly(0.0, threads=2, n_cpus=2)
    assert measured_quietly(0.2, threads=2, n_cpus=2)  # a shell or a terminal: within the engine's slack
    assert not measured_quietly(0.3, threads=2, n_cpus=2)  # the engine itself would drop a thread here
    assert not measured_quietly(1.0, threads=2, n_cpus=2)
    assert measured_quietly(1.0, threads=2, n_cpus=4)  # cores to spare: the probe's threads kept theirs
    assert measured_quietly(2.0, threads=1, n_cpus=2)  # one thread always has a core


def test_probe_sizes_time_short_batches_and_the_longest() -> None:
    assert probe_sizes(17) == (1, 2, 3, 5, 9, 17)
    assert probe_sizes(4) == (1, 2, 3, 4)
    assert probe_sizes(1) == (1, 2)


def test_costs_take_each_sizes_fastest_round_interpolate_and_never_decrease() -> None:
    times = {1: [0.010, 0.030], 2: [0.018, 0.050], 3: [0.025], 5: [0.024], 9: [0.045], 17: [0.080]}
    costs = costs_from_times(times, 17)
    assert len(costs) == 17 and costs[0] == 1.0
    assert costs[1] == pytest.approx(1.8) and costs[2] == pytest.approx(2.5)
    assert costs[4] == pytest.approx(2.5)  # 5 timed faster than 3: noise, held at 3's cost
    assert costs[6] == pytest.approx(3.45)  # between 5 (2.4 timed) and 9 (4.5), linearly
    assert costs[16] == pytest.approx(8.0)
    assert all(b >= a for a, b in pairwise(costs))
    with pytest.raises(ValueError, match="plain step"):
        costs_from_times({2: [0.1]}, 4)


def test_the_latest_table_of_the_key_that_covers_the_drafts_is_used() -> None:
    old = VerifyCostRecord("k", (1.0, 2.0, 3.0), 10.0, others_busy=0.0)
    new = VerifyCostRecord("k", (1.0, 1.5, 2.0, 2.5), 9.0, others_busy=0.1)
    other = VerifyCostRecord("other", (1.0, 1.1, 1.2, 1.3), 9.0, others_busy=0.0)
    assert measured_verify_costs([old, new, other], "k", 4) == new
    assert measured_verify_costs([old, other], "k", 4) is None  # too short for 3 drafted tokens
    assert measured_verify_costs([old], "k", 3) == old
    assert measured_verify_costs([VerifyCostRecord("k", (2.0, 3.0), 1.0, others_busy=0.0)], "k", 2) is None
    # Kept before the probe looked at the load (it may be a table of stalls: 418 ms steps on a 10 ms model):
    # not used, so the engine measures again.
    unchecked = VerifyCostRecord("k", (1.0, 1.07, 1.27, 1.44), 417.6)
    assert measured_verify_costs([old, unchecked], "k", 3) == old
    assert measured_verify_costs([unchecked], "k", 3) is None


def test_records_replace_their_key_and_a_damaged_file_gives_none(isolated_dirs: Path) -> None:
    add_verify_costs(VerifyCostRecord("a", (1.0, 2.0), 5.0))
    add_verify_costs(VerifyCostRecord("b", (1.0, 3.0), 5.0))
    add_verify_costs(VerifyCostRecord("a", (1.0, 1.5), 4.0, "2026-12-01"))
    assert [(r.key, r.costs) for r in load_verify_costs()] == [("b", (1.0, 3.0)), ("a", (1.0, 1.5))]
    verify_costs_path().write_text("{not json")
    assert load_verify_costs() == []
    verify_costs_path().write_text(json.dumps([{"key": "a"}, {"key": "b", "costs": [1, 2], "step_ms": 3}]))
    assert [(r.key, r.others_busy) for r in load_verify_costs()] == [("b", None)]
    add_verify_costs(VerifyCostRecord("c", (1.0, 1.5), 4.0, "2026-12-03", others_busy=0.12))
    assert load_verify_costs()[-1].others_busy == 0.12


@pytest.mark.slow
@pytest.mark.usefixtures("quiet_cpu")
def test_first_load_measures_later_plans_use_the_measurement_and_replies_repeat(gemma_path: Path) -> None:
    from helpers_engine import generate_text

    from clover_local.engine.benchmark import WORKLOADS
    from clover_local.engine.types import GenerationRequest
    from clover_local.launch import LaunchRequest, decide_launch, measure_verify_costs, open_launch
    from clover_local.presets import load_preset

    preset = load_preset("gemma3-270m")
    asked = LaunchRequest(preset, str(gemma_path), ctx=2048)
    launch = decide_launch(asked)
    plan = launch.plan
    spec = plan.speculative
    assert spec.costs_source == "model" and spec.costs_key.endswith(
        f"t={plan.threads},tb={plan.threads_batch}"
    )
    assert not any("Verification cost measured" in r.text for r in plan.reasons)

    opened = open_launch(launch, measure_costs=False)
    assert load_verify_costs() == []  # loading measures nothing: measuring is its own step, after it
    probe = measure_verify_costs(opened)  # what open_launch does next for every front end
    request = GenerationRequest(
        prompt=WORKLOADS["code_rewrite"], max_tokens=48, temperature=0.0, stop=("```",)
    )
    try:
        assert probe is not None and probe.kept and "verifying a draft costs" in probe.notice.text
        assert probe.notice.code == "verify-costs"
        (record,) = load_verify_costs()
        assert record.key == spec.costs_key and len(record.costs) == spec.n_max + 1
        assert record.others_busy == 0.0
        assert record.costs[0] == 1.0 and all(b >= a for a, b in pairwise(record.costs))
        assert record.step_ms > 0
        assert opened.engine.speculative.batch_costs == record.costs
        first, _ = generate_text(opened.engine, request)
        again, _ = generate_text(opened.engine, request)
        assert again == first  # one engine, one cost table: the same text every time
    finally:
        opened.engine.close()
    written = verify_costs_path().read_bytes()

    later = decide_launch(asked).plan
    assert later.speculative.costs_source == "measured" and later.speculative.batch_costs == record.costs
    assert any("Verification cost measured here" in r.text for r in later.reasons)
    reopened = open_launch(decide_launch(asked))
    try:
        assert measure_verify_costs(reopened) is None  # measured once, not again
        assert reopened.engine.speculative.batch_costs == record.costs
        assert generate_text(reopened.engine, request)[0] == first  # a new load decides with the same numbers
    finally:
        reopened.engine.close()
    assert verify_costs_path().read_bytes() == written


@pytest.mark.slow
@pytest.mark.usefixtures("busy_cpu")
def test_a_probe_beside_busy_programs_is_neither_kept_nor_used(tiny_models: dict[str, Path]) -> None:
    from clover_local.launch import LaunchRequest, decide_launch, measure_verify_costs, open_launch

    model = str(tiny_models["llama"])
    asked = LaunchRequest(None, model, ctx=512, threads=2, engine="embedded", spec="ngram")
    launch = decide_launch(asked)
    model_costs = launch.plan.speculative.batch_costs
    opened = open_launch(launch)
    try:
        probe = measure_verify_costs(opened)
        assert probe is not None and not probe.kept
        assert "Did not keep" in probe.notice.text and "measured again at a later load" in probe.notice.text
        assert opened.engine.speculative.batch_costs == model_costs  # the model's table, not the stalls'
    finally:
        opened.engine.close()
    assert load_verify_costs() == []
    assert decide_launch(asked).plan.speculative.costs_source == "model"  # the next load measures again


@pytest.mark.slow
@pytest.mark.usefixtures("busy_cpu")
def test_bench_verify_costs_beside_busy_programs_keeps_nothing_and_says_so(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from clover_local.cli import main

    model = str(tiny_models["llama"])
    assert main(["bench", "--verify-costs", "--model", model, "--ctx", "512", "--threads", "2"]) == 1
    err = capsys.readouterr().err
    assert "Did not keep" in err and "otherwise idle" in err
    assert load_verify_costs() == []


@pytest.mark.slow
@pytest.mark.usefixtures("quiet_cpu")
def test_bench_verify_costs_measures_again_and_keeps_it(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from clover_local.cli import main

    model = str(tiny_models["llama"])
    assert main(["bench", "--verify-costs", "--model", model, "--ctx", "512", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["costs"][0] == 1.0 and len(first["costs"]) >= 3 and first["step_ms"] > 0
    assert [r.key for r in load_verify_costs()] == [first["key"]]
    assert main(["bench", "--verify-costs", "--model", model, "--ctx", "512"]) == 0
    assert "Kept for later plans" in capsys.readouterr().out
    (again,) = load_verify_costs()  # measured anew, replacing the first table of the same key
    assert again.key == first["key"]


def test_a_hybrid_plans_key_says_verifying_copies_the_state_so_older_tables_are_measured_again(
    tiny_models: dict[str, Path],
) -> None:
    """On a recurrent model an n-gram verification copies the state first (``DraftRollback``), part of what a
    batch costs: a table measured while llama.cpp's snapshots did the rollback (no mark in its key) is not used."""
    from clover_local.launch import LaunchRequest, decide_launch

    hybrid = decide_launch(
        LaunchRequest(None, str(tiny_models["qwen35moe"]), ctx=512, threads=2, spec="ngram")
    )
    attention = decide_launch(
        LaunchRequest(None, str(tiny_models["llama"]), ctx=512, threads=2, spec="ngram")
    )
    key = hybrid.plan.speculative.costs_key
    assert key.endswith(",rollback=copy") and not attention.plan.speculative.costs_key.endswith(
        ",rollback=copy"
    )
    n = hybrid.plan.speculative.n_max + 1
    older = VerifyCostRecord(
        key.removesuffix(",rollback=copy"), tuple(1.0 + i for i in range(n)), 10.0, "", 0.0
    )
    add_verify_costs(older)
    assert (
        decide_launch(
            LaunchRequest(None, str(tiny_models["qwen35moe"]), ctx=512, threads=2, spec="ngram")
        ).plan.speculative.costs_source
        == "model"
    )
    add_verify_costs(VerifyCostRecord(key, tuple(1.0 + i / 2 for i in range(n)), 10.0, "", 0.0))
    again = decide_launch(
        LaunchRequest(None, str(tiny_models["qwen35moe"]), ctx=512, threads=2, spec="ngram")
    )
    assert again.plan.speculative.costs_source == "measured"

"""bench.recipe_size: GRRM's recipe through verl's reward path into one replica of grrm.yaml. Its quick form (64
prompts x 8, slots scaled with the step, a 10 s generation phase) runs on the session's Serve and must see no
member refused, defaulted or stuck, at a size where the bound before issue 58 would have refused; its pure
parts (the peak of open spans, the GPU-like engine time, the rows' check) in the quick tier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.recipe_size import (
    ANSWER_TOKENS_PER_CANDIDATE,
    ENGINE_SEQUENCES,
    OLD_WAITING_MEMBERS,
    RECIPE_PROMPTS,
    engine_options,
    peak_between,
    problems,
)


def test_the_peak_counts_spans_open_at_once_and_touching_ones_apart():
    assert peak_between([]) == 0
    assert peak_between([(0, 10), (1, 2), (1.5, 3), (2, 4)]) == 3
    assert peak_between([(0, 1), (1, 2), (2, 3)]) == 1


def test_the_engine_takes_a_gpu_like_time_per_group():
    options = engine_options(quick=False)
    assert options.max_concurrent_prompts == ENGINE_SEQUENCES

    def replica_seconds_per_group(candidates: int, prompt_tokens: int) -> float:
        answer = options.analysis_words + ANSWER_TOKENS_PER_CANDIDATE * candidates
        return (answer * options.per_token_s + prompt_tokens * options.prefill_token_s) / ENGINE_SEQUENCES

    assert 1.3 <= replica_seconds_per_group(8, 1500) <= 1.6  # BENCHMARKS 4b's 1.5 s per group of 8
    assert 0.6 <= replica_seconds_per_group(4, 800) <= 0.8
    assert engine_options(quick=True).per_token_s < options.per_token_s / 100


def test_the_check_holds_todays_rows_to_no_default_and_shows_the_old_ones():
    good = {"admission": "derived", "mode": "spread", "n": 8, "defaulted": 0, "refused_then_defaulted": 0,
            "stuck_members": 0, "wrong_rewards": 0, "defaulted_by": {}}
    assert problems([good]) == []
    bad = {**good, "defaulted": 9, "refused_then_defaulted": 9, "defaulted_by": {"overloaded": 9}}
    assert problems([bad]) == ["spread n=8: defaulted 9 ({'overloaded': 9})",
                               "spread n=8: refused_then_defaulted 9 ({'overloaded': 9})"]
    assert problems([{**bad, "admission": "old"}]) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_quick_recipe_waits_every_member_without_a_refusal(serve_instance, tmp_path: Path, monkeypatch):
    from bench import recipe_size

    monkeypatch.setenv("GRRM_BENCH_RESULTS", str(tmp_path))
    assert recipe_size.main(["--quick"]) == 0
    rows = json.loads((tmp_path / "recipe_size.json").read_text())
    assert {(row["mode"], row["n"]) for row in rows} == {("end", 8), ("spread", 8)}
    old_bound = OLD_WAITING_MEMBERS * rows[0]["prompts"] // RECIPE_PROMPTS
    for row in rows:
        assert row["members"] == row["prompts"] * row["n"]
        assert (row["defaulted"], row["refused_then_defaulted"], row["stuck_members"], row["wrong_rewards"]) \
            == (0, 0, 0, 0), row
        assert row["refused"] == row["refused_by_replica"] == 0, row  # admission refused no member
        assert row["peak_waiting"] <= row["waiting_bound"]
    spread = next(row for row in rows if row["mode"] == "spread")
    # The step is large enough for the bound to matter: before issue 58 its new groups would have been refused.
    assert spread["peak_waiting"] > old_bound, (spread["peak_waiting"], old_bound)

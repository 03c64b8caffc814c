"""The TRL adapter's logic (``grrm_client/adapters/trl.py``), in milliseconds: how TRL's call becomes groups,
what comes back, what is logged, and that it pickles. Follows TRL 1.16's source:
``GRPOTrainer._calculate_rewards`` (keyword arguments, ``None`` per completion allowed) and
``trl.experimental.async_grpo``'s rollout worker (one call per complete group, pickled into a child).

The service is the in-process one of the bridge tests (the real ``GroupAssembler`` and ``GroupScorer``
on the scripted engine, whose score of a candidate is its ``[q=N]`` marker); the live service is
``test_trl_live.py``'s."""

from __future__ import annotations

import asyncio
import pickle
import types

import pytest
from pydantic import ValidationError

from cluster.engines import ScriptedEngineOptions
from grrm_client.reward_client import RewardClient
from grrm_client.adapters.trl import GRRMReward, completion_text, slice_groups
from tests.bridge.helpers import LocalTransport, recipe

GROUP = 4


def texts(group: int, qualities: list[int]) -> list[str]:
    return [f"Die Katze {group}-{k} schläft [q={q}]." for k, q in enumerate(qualities)]


def columns(count: int, **overrides) -> dict:
    return {"source": ["The cat sleeps."] * count, "src_lang": ["en"] * count, "trg_lang": ["de"] * count, **overrides}


def adapter(service: LocalTransport, **settings) -> GRRMReward:
    reward = GRRMReward(url="http://unused", num_generations=GROUP, extractor="none", **settings)
    reward._client = RewardClient(reward.config, transport=service)
    return reward


def call(reward: GRRMReward, completions: list, *, trainer_state=object(), metrics=None, **extra):
    log_metric = (lambda name, value: metrics.append((name, value))) if metrics is not None else None
    return asyncio.run(reward(prompts=["p"] * len(completions), completions=completions, completion_ids=None,
                              trainer_state=trainer_state, log_metric=log_metric, log_extra=None,
                              **{**columns(len(completions)), **extra}))


def test_slice_groups_lays_a_rank_slice_over_global_groups():
    # Rank 1 of 2, 6 completions each, 4 per group: the tail of group 1 and all of group 2.
    assert slice_groups(6, 6, 4) == {1: [(0, 2), (1, 3)], 2: [(2, 0), (3, 1), (4, 2), (5, 3)]}
    assert slice_groups(0, 8, 4) == {0: [(i, i) for i in range(4)], 1: [(4 + i, i) for i in range(4)]}


def test_completion_text_reads_plain_and_conversational_completions():
    assert completion_text("Hallo") == "Hallo"
    assert completion_text([{"role": "assistant", "content": "Hallo"}]) == "Hallo"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "Hal"}, {"type": "text",
                                                                                               "text": "lo"}]}]) == "Hallo"
    with pytest.raises(ValueError, match="completions: expected a string or a list of messages, got int"):
        completion_text(3)


def test_settings_are_checked_at_construction_naming_the_field():
    with pytest.raises(ValueError, match="exactly one of url= .* or app_name="):
        GRRMReward(num_generations=4)
    with pytest.raises(ValueError, match="exactly one of url="):
        GRRMReward(url="http://x", app_name="grrm", num_generations=4)
    with pytest.raises(ValidationError, match="num_generations"):
        GRRMReward(url="http://x", num_generations=0)
    with pytest.raises(ValidationError, match="process_index: 2 is not below num_processes 2"):
        GRRMReward(url="http://x", num_generations=4, process_index=2, num_processes=2)
    with pytest.raises(ValidationError, match="extractor"):
        GRRMReward(url="http://x", num_generations=4, extractor="regex")
    assert GRRMReward(url="http://host:8000/grrm/", num_generations=4).config.http_url == "http://host:8000/grrm"


def test_whole_groups_of_one_process_are_scored_as_groups_with_the_recipes_rewards():
    service = LocalTransport(recipe=recipe(default_reward=-1.0, scale=0.5))
    reward = adapter(service, default_reward=-7.0, score_scale_factor=3.0)  # not the recipe's: never applied
    metrics = []
    # Group 0: four distinct texts; group 1: two identical valid texts and two blanks (no translation).
    completions = texts(0, [2, 8, 5, 9]) + [texts(1, [7])[0], texts(1, [7])[0], " ", ""]
    rewards = call(reward, completions, metrics=metrics)
    assert rewards[:4] == [1.0, 4.0, 2.5, 4.5]  # the recipe's score x 0.5
    assert rewards[4:] == [-1.0] * 4  # too few distinct texts, and the blanks: the recipe's default
    # Group 0 whole; group 1, with completions that hold no translation, as its 4 members.
    assert len(service.group_requests) == 1 and service.calls == 1 + 4
    logged = dict(metrics)
    assert logged["grrm/valid"] == 4 and logged["grrm/default"] == 4 and logged["grrm/failed"] == 0
    # The recipe's part, once per completion: TRL averages them into the step's mean (0 where absent).
    assert [value for name, value in metrics if name == "grrm/component/grrm/mean"] == [1.0, 4.0, 2.5, 4.5, 0, 0, 0, 0]


def test_a_rows_reference_notes_and_token_counts_go_with_its_group():
    service = LocalTransport()
    reward = adapter(service)
    context = {"ref_text": ["Die Katze schläft."] * 4, "ref_lang": ["de"] * 4, "notes": ["Katze, not Kater."] * 4}
    ids = [[1] * (10 + k) for k in range(4)]
    assert asyncio.run(reward(prompts=["p"] * 4, completions=texts(0, [1, 2, 3, 4]), completion_ids=ids,
                              trainer_state=object(), **columns(4), **context)) == [1, 2, 3, 4]
    (sent,) = service.group_requests
    assert (sent.ref_text, sent.ref_lang, sent.notes, sent.response_tokens) == (
        "Die Katze schläft.", "de", "Katze, not Kater.", [10, 11, 12, 13])
    assert "Katze, not Kater." in service.engine.prompts_seen[-1]
    # A reference without its language: refused before it is sent (the service's 422), each completion's
    # reward None and counted, never a crash; pandas' missing values (NaN) are no reference at all.
    metrics = []
    rewards = call(reward, texts(1, [1, 2, 3, 4]), metrics=metrics, ref_text=["Die Katze schläft."] * 4)
    assert rewards == [None] * 4 and dict(metrics)["grrm/failed/rejected"] == 4 and len(service.group_requests) == 1
    assert call(reward, texts(2, [1, 2, 3, 4]), ref_text=[float("nan")] * 4, ref_lang=[None] * 4) == [1, 2, 3, 4]


def test_a_group_split_over_two_processes_meets_on_the_service_under_one_id():
    service = LocalTransport()
    ranks = [adapter(service, run_id="run-x", process_index=rank, num_processes=2) for rank in (0, 1)]
    batch = texts(0, [1, 2, 3, 4]) + texts(1, [9, 3, 7, 5]) + texts(2, [6, 6, 1, 0])

    async def both():
        return await asyncio.gather(*(
            ranks[rank](prompts=["p"] * 6, completions=batch[rank * 6:(rank + 1) * 6], completion_ids=None,
                        trainer_state=object(), **columns(6))
            for rank in (0, 1)))

    first, second = asyncio.run(both())
    assert first + second == [1, 2, 3, 4, 9, 3, 7, 5, 6, 6, 1, 0]
    # Groups 0 and 2 went whole; group 1's four members met in the assembler as run-x:0:1.
    assert sorted(group.group_id for group in service.group_requests) == ["run-x:0:0", "run-x:0:2"]
    traces = service.recent.since()
    assert [(trace.group_id, trace.group_size) for trace in traces] == [("run-x:0:1", 4)]
    # The next call is another group namespace: equal positions never meet earlier verdicts.
    again = asyncio.run(both())
    assert again == [[1, 2, 3, 4, 9, 3], [7, 5, 6, 6, 1, 0]]
    assert [trace.group_id for trace in service.recent.since()] == ["run-x:0:1", "run-x:1:1"]


def test_a_failed_group_gets_the_recipes_default_and_no_answer_is_none_both_counted_by_reason():
    # Every verdict of this engine is malformed: after the service's retries, the group has no scores, and
    # the service's answer carries its recipe's default (flagged): that is the reward.
    service = LocalTransport(scripted=ScriptedEngineOptions(malformed_rate=1.0), recipe=recipe(default_reward=-1.0))
    reward = adapter(service)
    metrics = []
    rewards = call(reward, texts(0, [1, 2, 3, 4]), metrics=metrics)
    assert rewards == [-1.0] * 4
    logged = dict(metrics)
    assert logged["grrm/failed"] == 4 and logged["grrm/failed/parse_failed"] == 4 and logged["grrm/valid"] == 0
    # No answer at all (nothing listens there): None, never a made-up number.
    unreachable = GRRMReward(url="http://127.0.0.1:9", num_generations=GROUP, extractor="none", deadline_s=0.5,
                             max_attempts=1, announce_demand=False)
    metrics = []
    assert call(unreachable, texts(0, [1, 2, 3, 4]), metrics=metrics) == [None] * 4
    assert dict(metrics)["grrm/failed"] == 4


def test_the_async_trainer_calls_once_per_group_without_trainer_state_and_the_adapter_pickles():
    service = LocalTransport()
    reward = adapter(service)
    assert call(reward, texts(0, [3, 1, 4, 1]), trainer_state=None) == [3, 1, 4, 1]
    clone = pickle.loads(pickle.dumps(reward))  # a client belongs to one process: made anew there
    assert clone._client is None and clone.config == reward.config and clone.__name__ == "grrm"
    with pytest.raises(ValueError, match="6 completions are not whole groups of num_generations=4"):
        call(reward, texts(0, [1, 2, 3, 4, 5, 6]), trainer_state=None)
    # Two calls of equal groups get ids of their own: the second is scored, not read from the first.
    call(reward, texts(0, [3, 1, 4, 1]), trainer_state=None)
    ids = [group.group_id for group in service.group_requests]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert service.announcements == []  # calls per group have no steps to announce


def test_each_step_announces_its_groups_and_the_next_step_ahead_once_two_were_seen(monkeypatch):
    """Every process announces the whole step's groups (its slice x processes / num_generations) when a
    step's call opens a phase; from the second step on, the next step is announced when this one's
    rewards should be in, starting a step's period after this step began. The adapter's clock is the
    test's (steps 1.3 s apart); the announcement ahead is waited for, not slept past."""
    service = LocalTransport()
    reward = adapter(service, process_index=0, num_processes=2, run_id="two-ranks", phase_gap_s=0.5)
    clock = [1000.0]
    monkeypatch.setattr("grrm_client.adapters.trl.time", types.SimpleNamespace(time=lambda: clock[0]))

    async def announced_so_far(count: int) -> None:
        while len(service.announcements) < count:
            await asyncio.sleep(0.01)

    async def steps() -> list[float]:
        began = []
        for step in range(3):
            if step:
                clock[0] += 1.3  # generation and training between two calls
            began.append(clock[0])
            await reward(prompts=["p"] * 8, completions=texts(step, [1, 2, 3, 4, 5, 6, 7, 8]), completion_ids=None,
                         trainer_state=object(), log_metric=None, log_extra=None, **columns(8))
            if step:  # the next step announced ahead, when this one's rewards should be in (1 s after it began)
                await asyncio.wait_for(announced_so_far(2 * step + 1), 30)
        reward._demand.close()
        return began

    began = asyncio.run(steps())
    announced = service.announcements
    assert [one.groups for one in announced] == [4] * 5  # 8 completions x 2 processes / 4 per group
    # Each step when it begins; the first lasts the default 60 s, the next ones as long as the steps seen.
    assert [(announced[i].starts_in_s, announced[i].lasts_s) for i in (0, 1, 3)] == [(0.0, 60.0), (0.0, 1.0), (0.0, 1.0)]
    # From the second step on, the next one 1 s after a step began: a period (the median) after its start.
    assert announced[2].starts_in_s == pytest.approx(began[1] - began[0] - 1.0), announced
    assert announced[4].starts_in_s == pytest.approx((began[2] - began[0]) / 2 - 1.0), announced
    quiet = LocalTransport()
    call(adapter(quiet, announce_demand=False), texts(0, [3, 1, 4, 1]))
    assert quiet.announcements == [] and quiet.calls == 1


def test_a_dataset_without_the_source_column_is_refused_naming_it():
    reward = adapter(LocalTransport())
    with pytest.raises(ValueError, match="origin: the dataset has no such column"):
        asyncio.run(GRRMReward(url="http://x", num_generations=4, source_key="origin")(
            prompts=["p"] * 4, completions=texts(0, [1, 2, 3, 4]), trainer_state=object(), **columns(4)))
    # Languages may come from the settings instead of the dataset.
    defaults = adapter(LocalTransport(), src_lang="en", trg_lang="de")
    rewards = asyncio.run(defaults(prompts=["p"] * 4, completions=texts(0, [1, 2, 3, 4]), trainer_state=object(),
                                   source=["The cat sleeps."] * 4))
    assert rewards == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="src_lang: the dataset has no such column"):
        asyncio.run(reward(prompts=["p"] * 4, completions=texts(0, [1, 2, 3, 4]), trainer_state=object(),
                           source=["The cat sleeps."] * 4))

"""GRRMRewardManager with real verl structures: built by verl's own loader, fed the one-row
DataProto verl's agent loop sends, members of a group in random order. The cluster is the real
assembler + scorer + scripted engine in this process (the Ray Serve version is in
test_bridge_cluster.py)."""

from __future__ import annotations

import asyncio
import time
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cluster.engines import ScriptedEngineOptions
from grrm_client import RewardClient
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, row_components
from grrm_client.adapters.verl.metrics import step_metrics

from .helpers import (
    LocalTransport,
    agent_loop_row,
    codeblock,
    fully_async_row_fields,
    quality_text,
    recipe,
    row_fields,
    session_row_fields,
    shuffled,
    verl_config,
)


MANAGER_FILE = Path(__file__).resolve().parents[2] / "trainer_bridge" / "reward_manager.py"


def load_manager(tokenizer, n: int, reward_kwargs: dict | None = None, module_path: str | None = None, transport=None,
                 train_batch_size: int | None = None):
    """The manager exactly as verl 0.9.1's RewardLoopWorker builds it (load_reward_manager)."""
    from verl.trainer.ppo.reward import load_reward_manager

    config = verl_config(n=n, reward_kwargs=reward_kwargs, module_path=module_path, train_batch_size=train_batch_size)
    manager = load_reward_manager(config, tokenizer, reward_router_address=None, reward_model_tokenizer=None)
    if transport is not None:
        manager.client = RewardClient(manager.bridge, transport)
    return manager


@pytest.mark.parametrize("module_path", ["pkg://trainer_bridge.reward_manager", str(MANAGER_FILE)])
def test_verl_loads_the_manager_by_importlib(tokenizer, module_path):
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    from grrm_client.adapters.verl.reward_manager import GRRMRewardManager

    resolved = resolve_reward_manager_cls(verl_config(n=6, module_path=module_path))
    assert resolved.__name__ == "GRRMRewardManager" and issubclass(resolved, GRRMRewardManager.__mro__[1])
    manager = load_manager(tokenizer, n=6, reward_kwargs={"extractor": "line", "default_reward": -1.0}, module_path=module_path)
    assert type(manager).__name__ == "GRRMRewardManager"
    assert manager.bridge.group_size == 6 and manager.bridge.extractor == "line"
    assert manager.settings.default_reward == -1.0
    assert manager.tokenizer is tokenizer


def test_manager_is_also_registered_under_a_name():
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

    from grrm_client.adapters.verl.reward_manager import GRRMRewardManager

    assert get_reward_manager_cls("grrm") is GRRMRewardManager


async def run_rollouts(manager, tokenizer, rollouts, seed=0):
    """Send (uid, priority, response) rollouts through run_single concurrently, in random order."""
    order = shuffled(list(range(len(rollouts))), seed)
    rows = {i: agent_loop_row(tokenizer, rollouts[i][2], row_fields(rollouts[i][0], rollouts[i][1])) for i in order}
    answers = await asyncio.gather(*(manager.run_single(rows[i]) for i in order))
    by_row = dict(zip(order, answers, strict=True))
    return [by_row[i] for i in range(len(rollouts))]


async def test_members_of_a_group_arriving_in_any_order_are_scored_as_one_group(tokenizer):
    transport = LocalTransport(recipe=recipe(default_reward=-0.25, scale=0.1))
    manager = load_manager(tokenizer, n=4, transport=transport)
    qualities = {"u1": [3, 8, 8, 5], "u2": [1, 10, 6, 6]}
    rollouts = []
    for g, uid in enumerate(qualities):
        for j, q in enumerate(qualities[uid]):
            text = quality_text(g, j, q)
            if uid == "u1" and j == 2:
                text = quality_text(g, 1, 8)  # an exact duplicate of rollout 1
            if uid == "u2" and j == 3:
                rollouts.append((uid, g * 4 + j, "I will not answer in a code block."))  # invalid
                continue
            rollouts.append((uid, g * 4 + j, codeblock(text)))
    answers = await run_rollouts(manager, tokenizer, rollouts, seed=3)
    rewards = [a["reward_score"] for a in answers]
    assert rewards == pytest.approx([0.3, 0.8, 0.8, 0.5, 0.1, 1.0, 0.6, -0.25])
    infos = [a["reward_extra_info"] for a in answers]
    assert all(tuple(info) == EXTRA_INFO_KEYS for info in infos)
    assert [info["valid"] for info in infos] == [True] * 7 + [False]
    assert infos[7]["failure"] == "invalid_extraction" and not infos[7]["extracted"] and not infos[7]["failed"]
    assert {info["replica"] for info in infos[:7]} == {"local-replica"}
    # Two groups, each scored once; the duplicate was shown once, the invalid rollout not at all.
    assert transport.assembler.stats()["groups_scored"] == 2
    prompts = transport.engine.prompts_seen
    assert len(prompts) == 2
    u1_prompt = next(p for p in prompts if "Die Katze 0-" in p)
    assert u1_prompt.count("Translation ") == 3 and "Translation D" not in u1_prompt
    u2_prompt = next(p for p in prompts if "Die Katze 1-" in p)
    assert u2_prompt.count("Translation ") == 3 and "code block" not in u2_prompt
    metrics = manager.metrics()
    assert metrics["grrm/rewards"] == 8 and metrics["grrm/valid"] == 7 and metrics["grrm/default/invalid_extraction"] == 1


async def test_the_recipes_overlong_part_reads_the_rollouts_token_length(tokenizer):
    """DAPO's overlong penalty is the service recipe's part: the bridge sends each rollout's response
    length, takes the reward as composed and reports the part's value (before weighting) per row."""
    transport = LocalTransport(recipe=recipe(default_reward=0.0, scale=1.0,
                                             overlong={"max_response_tokens": 60, "buffer_tokens": 20, "penalty": 1.0}))
    manager = load_manager(tokenizer, n=2, reward_kwargs={"extractor": "codeblock"}, transport=transport)
    short = codeblock(quality_text(0, 0, 6), thinking="Ok.")
    long = codeblock(quality_text(0, 1, 9), thinking="Let me think step by step about every single word here. " * 5)
    answers = await run_rollouts(manager, tokenizer, [("o", 0, short), ("o", 1, long)])
    lengths = [len(tokenizer.encode(r, add_special_tokens=False)) + 1 for r in (short, long)]  # + the eos token
    assert lengths[0] <= 40 < 60 < lengths[1]
    assert answers[0]["reward_score"] == 6.0 and answers[1]["reward_score"] == pytest.approx(9.0 - 1.0)
    parts = [row_components(answer["reward_extra_info"]) for answer in answers]
    assert parts == [{"grrm": 6.0, "overlong": 0.0}, {"grrm": 9.0, "overlong": -1.0}]
    assert manager.metrics()["grrm/rewards"] == 2
    assert step_metrics([a["reward_extra_info"] for a in answers])["grrm/component/overlong/mean"] == -0.5


async def test_a_rows_reference_and_notes_reach_the_prompt_and_a_half_pair_is_the_rows_flagged_failure(tokenizer):
    transport = LocalTransport()
    manager = load_manager(tokenizer, n=2, transport=transport)
    context = {"ref_text": "Die Katze sass auf der Matte.", "ref_lang": "de", "notes": "Matte: keep the word."}
    rows = [(f"r{j}", codeblock(quality_text(0, j, 4 + j)), row_fields("ref", j, **context)) for j in range(2)]
    answers = await asyncio.gather(*(manager.run_single(agent_loop_row(tokenizer, response, fields))
                                     for _, response, fields in rows))
    assert [a["reward_score"] for a in answers] == [4.0, 5.0]
    (prompt,) = transport.engine.prompts_seen
    assert context["ref_text"] in prompt and context["notes"] in prompt
    # A reference without its language: the service would refuse it (422); the row gets the flagged
    # default and nothing is sent, so nobody waits for it.
    calls = transport.calls
    half = row_fields("half", 0, ref_text="Die Katze sass.")
    answer = await manager.run_single(agent_loop_row(tokenizer, codeblock("x"), half))
    info = answer["reward_extra_info"]
    assert (answer["reward_score"], info["failure"], info["failed"]) == (0.0, "rejected", True)
    assert transport.calls == calls


async def test_unparseable_verdicts_give_the_default_flagged_and_masked(tokenizer):
    transport = LocalTransport(scripted=ScriptedEngineOptions(malformed_rate=1.0),
                               recipe=recipe(default_reward=-1.0, scale=10.0))
    manager = load_manager(tokenizer, n=3, reward_kwargs={"mask_failed": True}, transport=transport)
    rollouts = [("f", j, codeblock(quality_text(0, j, 4 + j))) for j in range(3)]
    answers = await run_rollouts(manager, tokenizer, rollouts)
    for answer in answers:
        info = answer["reward_extra_info"]
        assert answer["reward_score"] == -1.0  # the recipe's default, not default * scale
        assert info["failure"] == "parse_failed" and info["failed"] and info["masked"] and not info["valid"]
        assert info["attempts"] == 2  # the service's first attempt and its one retry
    assert manager.metrics()["grrm/masked"] == 3


async def test_group_with_one_distinct_translation_is_not_scored(tokenizer):
    transport = LocalTransport()
    manager = load_manager(tokenizer, n=3, transport=transport)
    same = codeblock("Die Katze sass auf der Matte.")
    answers = await run_rollouts(manager, tokenizer, [("d", 0, same), ("d", 1, "no block"), ("d", 2, same)])
    assert [a["reward_extra_info"]["failure"] for a in answers] == ["too_few_distinct", "invalid_extraction", "too_few_distinct"]
    assert all(not a["reward_extra_info"]["failed"] for a in answers)
    assert transport.engine.prompts_seen == []  # no engine call


async def test_group_of_one_and_bad_rows_never_raise(tokenizer, caplog):
    transport = LocalTransport()
    manager = load_manager(tokenizer, n=1, transport=transport)
    answer = await manager.run_single(agent_loop_row(tokenizer, codeblock("x"), row_fields("solo", 0)))
    assert answer["reward_extra_info"]["failure"] == "too_few_distinct" and transport.calls == 0

    manager = load_manager(tokenizer, n=2, reward_kwargs={"default_reward": -0.5}, transport=transport)
    bad_rows = []
    fields = row_fields("nosrc", 0)
    del fields["extra_info"]["source"]
    bad_rows.append(fields)
    bad_rows.append(session_row_fields("out-of-range", 5))  # session 5 in a group of 2
    fields = row_fields("junk-priority", 0)
    fields["priority"] = "first"
    bad_rows.append(fields)
    with caplog.at_level(logging.WARNING, logger="grrm_client.adapters.verl.reward_manager"):
        answers = [await manager.run_single(agent_loop_row(tokenizer, codeblock("x"), f)) for f in bad_rows]
    for answer in answers:
        info = answer["reward_extra_info"]
        assert answer["reward_score"] == -0.5
        assert tuple(info) == EXTRA_INFO_KEYS and info["failure"] == "bad_row" and info["failed"] and not info["valid"]
    assert transport.calls == 0
    # Logged once for the reason (naming the first problem), counted every time.
    logged = [r.getMessage() for r in caplog.records if "bad_row" in r.getMessage()]
    assert len(logged) == 1 and "extra_info.source" in logged[0]
    assert manager.metrics()["grrm/default/bad_row"] == 3 and manager.metrics()["grrm/failed"] == 3
    # A language the service does not know: flagged, never sent (so nobody waits for it).
    fields = row_fields("badlang", 0)
    fields["extra_info"]["src_lang"] = "xx"
    answer = await manager.run_single(agent_loop_row(tokenizer, codeblock("x"), fields))
    assert answer["reward_extra_info"]["failure"] == "rejected" and transport.calls == 0


async def test_rows_of_the_default_v1_trainer_are_grouped_by_session_id(tokenizer):
    """verl's default trainer: no priority, the n sessions of a prompt share its uid."""
    transport = LocalTransport(recipe=recipe(scale=0.5))
    manager = load_manager(tokenizer, n=3, transport=transport)
    qualities = {"p0": [2, 9, 5], "p1": [7, 1, 4]}
    rows = [
        (uid, session, agent_loop_row(tokenizer, codeblock(quality_text(g, session, q)), session_row_fields(uid, session)))
        for g, (uid, scores) in enumerate(qualities.items())
        for session, q in enumerate(scores)
    ]
    assert all("priority" not in row.non_tensor_batch for _, _, row in rows)
    order = shuffled(list(range(len(rows))), seed=5)
    answers = await asyncio.gather(*(manager.run_single(rows[i][2]) for i in order))
    by_row = dict(zip(order, answers, strict=True))
    rewards = [by_row[i]["reward_score"] for i in range(len(rows))]
    assert rewards == pytest.approx([1.0, 4.5, 2.5, 3.5, 0.5, 2.0])
    assert all(by_row[i]["reward_extra_info"]["valid"] for i in range(len(rows)))
    assert transport.assembler.stats()["groups_scored"] == 2 and transport.assembler.stats()["conflicts"] == 0


async def test_an_explicit_index_key_overrides_what_the_trainer_provides(tokenizer):
    transport = LocalTransport()
    manager = load_manager(tokenizer, n=2, reward_kwargs={"index_key": "extra_info.slot"}, transport=transport)
    rows = [
        agent_loop_row(tokenizer, codeblock(quality_text(0, j, 3 + 4 * j)), session_row_fields("k", 0, slot=j))
        for j in range(2)
    ]  # both rows claim session 0: only the explicit key tells them apart
    answers = await asyncio.gather(*(manager.run_single(row) for row in rows))
    assert [a["reward_score"] for a in answers] == [3.0, 7.0]


async def test_fully_async_rows_without_positions_are_scored_as_one_group_in_a_fixed_order(tokenizer):
    """fully_async_policy's rows carry no position: members are sent with ids of their own and the
    service orders each group by its texts, so the prompt is the same in any arrival order."""
    qualities = {"sample_0_1": [2, 9, 5, 7], "sample_0_2": [6, 1, 4, 8]}
    prompts = []
    for seed in (1, 2):
        transport = LocalTransport()
        manager = load_manager(tokenizer, n=4, transport=transport)
        rows = [
            agent_loop_row(tokenizer, codeblock(quality_text(g, j, q)), fully_async_row_fields(sample, dataset_index=g))
            for g, (sample, scores) in enumerate(qualities.items())
            for j, q in enumerate(scores)
        ]
        assert all("session_id" not in r.non_tensor_batch and "priority" not in r.non_tensor_batch for r in rows)
        order = shuffled(list(range(len(rows))), seed)
        answers = await asyncio.gather(*(manager.run_single(rows[i]) for i in order))
        by_row = dict(zip(order, answers, strict=True))
        assert [by_row[i]["reward_score"] for i in range(len(rows))] == [2, 9, 5, 7, 6, 1, 4, 8]
        infos = [by_row[i]["reward_extra_info"] for i in range(len(rows))]
        assert all(info["valid"] and info["failure"] == "" for info in infos)
        assert {info["group_id"] for info in infos} == {f"{manager.run_id}:uid_{sample}" for sample in qualities}
        stats = transport.assembler.stats()
        assert stats["groups_scored"] == 2 and stats["conflicts"] == 0 and stats["assembly_timeouts"] == 0
        prompts.append(sorted(transport.engine.prompts_seen))
    assert prompts[0] == prompts[1]


async def test_group_ids_are_namespaced_per_training_run(tokenizer):
    """fully_async_policy's uids repeat in every run, and a resumed run re-sends uids with new texts:
    on one service, another run's group with the same uid is scored anew, never refused."""
    transport = LocalTransport()

    async def run(run_id: str | None, quality_offset: int):
        manager = load_manager(tokenizer, n=2, reward_kwargs={} if run_id is None else {"run_id": run_id}, transport=transport)
        rows = [
            agent_loop_row(tokenizer, codeblock(quality_text(0, j, j + quality_offset)), session_row_fields("uid_sample_0_1", j))
            for j in range(2)
        ]
        return manager, await asyncio.gather(*(manager.run_single(row) for row in rows))

    first, answers = await run(None, 1)
    assert re.fullmatch(r"run-[0-9a-f]{12}", first.run_id)  # derived (here: one process outside Ray)
    assert [a["reward_score"] for a in answers] == [1, 2]
    _, answers = await run("run-resumed", 5)  # another run, the same uid, new texts
    assert [a["reward_score"] for a in answers] == [5, 6]
    assert {a["reward_extra_info"]["group_id"] for a in answers} == {"run-resumed:uid_sample_0_1"}
    assert transport.assembler.stats()["groups_scored"] == 2 and transport.assembler.stats()["conflicts"] == 0
    # Without a namespace the service could not tell the runs apart: the new texts are conflicts.
    _, answers = await run("", 7)
    _, answers = await run("", 8)
    assert {a["reward_extra_info"]["failure"] for a in answers} == {"conflict"}


class _RaisingTransport:
    """A transport whose every call fails the way an unreachable service (or a bug) does."""

    def __init__(self, error: Exception):
        self.error = error
        self.calls = 0

    async def member(self, member, timeout_s, attempt=0, attempts_left=1):
        self.calls += 1
        raise self.error

    async def group(self, group, timeout_s, attempt=0, attempts_left=1):
        raise self.error

    async def aclose(self):
        return None


@pytest.mark.parametrize(
    ("error", "failure"),
    [
        ("unreachable", "unavailable"),
        (RuntimeError("bug in a transport"), "transport_error"),
    ],
)
async def test_an_unreachable_service_gives_flagged_defaults_after_retries(tokenizer, caplog, error, failure):
    from cluster.protocol.calls import RetryableError

    if error == "unreachable":
        error = RetryableError("unavailable", "connection refused")
    transport = _RaisingTransport(error)
    manager = load_manager(
        tokenizer, n=2, reward_kwargs={"max_attempts": 3, "backoff_s": 0.01, "default_reward": -1.0}, transport=transport
    )
    rows = [agent_loop_row(tokenizer, codeblock(quality_text(0, j, 5)), session_row_fields("down", j)) for j in range(2)]
    with caplog.at_level(logging.WARNING, logger="grrm_client.adapters.verl.reward_manager"):
        answers = await asyncio.gather(*(manager.run_single(row) for row in rows))
    infos = [a["reward_extra_info"] for a in answers]
    assert [a["reward_score"] for a in answers] == [-1.0, -1.0]
    assert all(info["failure"] == failure and info["failed"] for info in infos)
    attempts = 3 if failure == "unavailable" else 1  # only transient errors are retried
    assert all(info["request_attempts"] == attempts for info in infos) and transport.calls == 2 * attempts
    assert len([r for r in caplog.records if failure in r.getMessage()]) == 1
    metrics = manager.metrics()
    assert metrics[f"grrm/default/{failure}"] == 2
    assert metrics["grrm/retries"] == 2 * (attempts - 1) and metrics["grrm/retried"] == (2 if attempts > 1 else 0)


async def test_an_internal_error_gives_a_flagged_default(tokenizer):
    manager = load_manager(tokenizer, n=2, transport=LocalTransport())

    async def broken(member):
        raise ZeroDivisionError("a bug")

    manager.client.score_member = broken
    answer = await manager.run_single(agent_loop_row(tokenizer, codeblock("x"), session_row_fields("bug", 0)))
    assert answer["reward_extra_info"]["failure"] == "internal_error" and answer["reward_extra_info"]["failed"]


async def test_a_row_may_override_the_group_size(tokenizer):
    transport = LocalTransport()
    manager = load_manager(tokenizer, n=8, transport=transport)  # training n; validation uses 2
    rows = [agent_loop_row(tokenizer, codeblock(quality_text(0, j, 2 + 5 * j)), row_fields("v", j, group_size=2)) for j in range(2)]
    answers = await asyncio.gather(*(manager.run_single(row) for row in rows))
    assert [a["reward_score"] for a in answers] == [2.0, 7.0]


async def test_grpo_advantage_on_streamed_rewards(tokenizer):
    """verl's compute_grpo_outcome_advantage on rewards placed by verl's own assemble_rm_scores."""
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    transport = LocalTransport()
    manager = load_manager(tokenizer, n=4, reward_kwargs={"score_scale_factor": 0.1}, transport=transport)
    rollouts = [(f"a{g}", 4 * g + j, codeblock(quality_text(g, j, (3 * g + 4 * j) % 11))) for g in range(3) for j in range(4)]
    answers = await run_rollouts(manager, tokenizer, rollouts, seed=11)
    rows = [agent_loop_row(tokenizer, r[2], row_fields(r[0], r[1])) for r in rollouts]
    # verl's agent loop pads each row into the batch; here: rows concatenated after padding.
    width = max(row.batch["responses"].shape[1] for row in rows)
    plen = max(row.batch["prompts"].shape[1] for row in rows)
    responses = torch.zeros(len(rows), width, dtype=torch.int64)
    attention = torch.zeros(len(rows), plen + width, dtype=torch.int64)
    for i, row in enumerate(rows):
        r = row.batch["responses"].shape[1]
        p = row.batch["prompts"].shape[1]
        responses[i, :r] = row.batch["responses"][0]
        attention[i, plen - p : plen + r] = 1
    data = DataProto.from_dict(
        {"prompts": torch.zeros(len(rows), plen, dtype=torch.int64), "responses": responses, "attention_mask": attention},
        non_tensors={"uid": np.array([r[0] for r in rollouts], dtype=object)},
    )
    scores = [a["reward_score"] for a in answers]
    token_rewards = type(manager).assemble_rm_scores(data, scores)
    assert token_rewards.sum(-1).tolist() == pytest.approx(scores)
    response_mask = attention[:, plen:]
    advantages, _ = compute_grpo_outcome_advantage(token_rewards, response_mask, data.non_tensor_batch["uid"])
    per_row = (advantages * response_mask).sum(-1) / response_mask.sum(-1)
    for g in range(3):
        group = per_row[4 * g : 4 * g + 4]
        assert abs(float(group.mean())) < 1e-5
        order = np.argsort([scores[4 * g + j] for j in range(4)])
        assert list(np.argsort(group.numpy())) == list(order)


async def test_each_run_is_a_tenant_of_the_service(tokenizer):
    """A run's members carry its run id as their tenant (metered and fairly served as one run), or the
    tenant the bridge is configured with."""
    transport = LocalTransport()
    sent: list = []
    original = transport.member

    async def recording(member, timeout_s, attempt=0, attempts_left=1):
        sent.append(member)
        return await original(member, timeout_s, attempt)

    transport.member = recording
    for kwargs, tag in (({"run_id": "sweep-lr-3e-6"}, 1), ({"run_id": "run-x", "tenant": "ablation-b"}, 2)):
        manager = load_manager(tokenizer, n=2, reward_kwargs=kwargs, transport=transport)
        rows = [agent_loop_row(tokenizer, codeblock(quality_text(0, j, j + tag)), session_row_fields(f"uid_{tag}", j))
                for j in range(2)]
        await asyncio.gather(*(manager.run_single(row) for row in rows))
    assert [member.tenant for member in sent] == ["sweep-lr-3e-6"] * 2 + ["ablation-b"] * 2


async def test_a_generation_phase_announces_its_steps_groups_once_and_the_next_phase_ahead(tokenizer):
    """The first rollout after a quiet gap opens a generation phase: the bridge announces the step's
    groups (data.train_batch_size prompts) for the service's autoscaling, over the time earlier phases
    took; the other rollouts of the phase announce nothing. Once two phases were seen, the next phase
    is announced when this one should end, starting a step's period after this one opened."""
    transport = LocalTransport()
    manager = load_manager(tokenizer, n=2, reward_kwargs={"phase_gap_s": 0.3}, transport=transport, train_batch_size=8)

    async def phase(tag: int) -> float:
        rows = [agent_loop_row(tokenizer, codeblock(quality_text(0, j, j + 1)), session_row_fields(f"phase{tag}", j))
                for j in range(2)]
        async def later(row, delay_s: float):
            await asyncio.sleep(delay_s)
            return await manager.run_single(row)

        opened = time.monotonic()
        # One after the other, 0.1 s apart: one phase.
        await asyncio.gather(*(later(row, 0.1 * j) for j, row in enumerate(rows)))
        await manager.demand.settled()
        return opened

    opened = [await phase(1)]
    assert [(one.groups, one.lasts_s, one.starts_in_s) for one in transport.announcements] == [(8, 60.0, 0.0)]
    await asyncio.sleep(0.4)  # the trainer trains
    opened.append(await phase(2))
    assert len(transport.announcements) == 2 and transport.announcements[1].groups == 8
    assert transport.announcements[1].lasts_s == 1.0  # the first phase took 0.1 s: at least 1 s is announced
    # When in the phase its groups come: before any phase, as if its rollouts came evenly (groups of 2
    # complete at the later one); then as in the first phase: both rollouts about 0.1 s apart, early
    # in the 1 s announced.
    first, second = (one.profile for one in transport.announcements)
    assert len(first) == 10 and first[-1] > first[0]
    assert second[0] > 0 and sum(second[:5]) == pytest.approx(1.0), second
    # Two phases seen, about 0.6 s apart; this one should last 1 s, longer than that: nothing ahead.
    await asyncio.sleep(1.2)
    assert len(transport.announcements) == 2
    await asyncio.sleep(2.0)  # a long training phase: the period grows past a phase's length
    opened.append(await phase(3))
    assert len(transport.announcements) == 3
    await asyncio.sleep(1.3)  # this phase should end 1 s after it opened: the next one is announced then
    assert len(transport.announcements) == 4, transport.announcements
    ahead = transport.announcements[3]
    assert ahead.groups == 8 and ahead.lasts_s == 1.0
    # The next phase opens the median period (of two: their mean) after this one did, 1 s after which
    # it is announced.
    expected = (opened[2] - opened[0]) / 2 - 1.0
    assert abs(ahead.starts_in_s - expected) < 0.2, (ahead, expected)
    assert {one.tenant for one in transport.announcements} == {manager.tenant}
    manager.demand.close()

    quiet = LocalTransport()
    unknown = load_manager(tokenizer, n=2, reward_kwargs={"phase_gap_s": 0.3}, transport=quiet)  # no batch size
    await asyncio.gather(*(unknown.run_single(agent_loop_row(tokenizer, codeblock(quality_text(0, j, j + 1)),
                                                              session_row_fields("u", j))) for j in range(2)))
    assert quiet.announcements == [] and quiet.calls == 2 and unknown.demand is None

"""RewardClient records its run's trace for grrm plan (ClientConfig.trace_path), without a cluster.

The service is ``LocalTransport`` (the real assembler and scorer on the scripted engine), so re-sends
inside the client's retry loop and the answers' usage are the real ones.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from cluster.planning.trace import RunTrace
from cluster.protocol.schema import GroupRequest, MemberRequest
from grrm_client import RewardClient
from grrm_client.adapters.verl.config import BridgeConfig

from .helpers import LocalTransport, quality_text


def members(group_id: str, sent_at: list[float | None]) -> list[MemberRequest]:
    return [MemberRequest(group_id=group_id, group_size=len(sent_at), index=index, source="s",
                          candidate=quality_text(1, index, 3 + index), src_lang="en", trg_lang="de", sent_at=at)
            for index, at in enumerate(sent_at)]


def read(path) -> RunTrace:
    return RunTrace.model_validate_json(path.read_text())


async def test_a_client_writes_its_run_when_a_step_ends_and_when_it_closes(tmp_path):
    path = tmp_path / "run.json"
    client = RewardClient(BridgeConfig(trace_path=str(path), phase_gap_s=5.0, tenant="run-a"),
                          LocalTransport(drop_first_answers=1))  # one member is sent twice by the retry loop
    now = time.time()
    step_one = await asyncio.gather(*(client.score_member(member)
                                      for member in members("g1", [now - 100.0, now - 99.0, now - 98.0])))
    assert all(outcome.result.valid for outcome in step_one)
    assert not path.exists()  # the step has not ended yet: no quiet gap seen

    # The next step: a whole group and members without a send time (the client stamps them).
    group = GroupRequest(group_id="g2", source="s", candidates=["a [q=3]", "b [q=8]"], src_lang="en", trg_lang="de")
    answered = await client.score_group(group)
    assert answered.result.valid and answered.result.usage.prompt_tokens > 0
    first = read(path)  # written when the whole group opened step two
    assert len(first.steps) == 1 and first.run == "run-a" and first.group_size == 3
    assert first.steps[0].start_s == now - 100.0
    assert first.steps[0].groups[0].members_at == [0.0, 1.0, 2.0]  # the re-sent member once, at its first send

    await asyncio.gather(*(client.score_member(member) for member in members("g3", [None, None])))
    await client.aclose()
    trace = read(path)
    assert len(trace.steps) == 2 and client.trace.writes == 2
    one, two = trace.steps
    assert one.training_s > 90 and two.start_s >= now
    assert [len(group.members_at) for group in two.groups] == [2, 2]
    usage = answered.result.usage
    assert two.groups[0].tokens == usage.prompt_tokens + usage.completion_tokens
    assert two.groups[1].tokens is None  # a member's answer carries no usage


async def test_a_client_never_closed_still_leaves_its_last_step_once_sends_pause(tmp_path):
    # verl's reward workers, TRL and slime never close their client: the last step is written once nothing
    # more is sent for phase_gap_s (its end, by the same rule that splits steps).
    path = tmp_path / "run.json"
    client = RewardClient(BridgeConfig(trace_path=str(path), phase_gap_s=0.3, tenant="run-a"), LocalTransport())
    await asyncio.gather(*(client.score_member(member) for member in members("g1", [None, None])))
    while not path.exists():  # written once phase_gap_s passed with nothing sent
        await asyncio.sleep(0.05)
    [step] = read(path).steps
    assert [(group.group_id, len(group.members_at)) for group in step.groups] == [("run-a:g1", 2)]
    assert client.trace.writes == 1  # that write alone: no step ended, the client is not closed


async def test_a_trace_that_cannot_be_written_costs_no_reward(tmp_path, caplog):
    path = tmp_path / "no-such-folder" / "run.json"
    client = RewardClient(BridgeConfig(trace_path=str(path), phase_gap_s=5.0), LocalTransport())
    now = time.time()
    with caplog.at_level(logging.WARNING, logger="grrm_client.trace_file"):
        for step, at in enumerate((now - 100.0, now - 50.0, now)):  # two step ends and the close: three writes
            outcomes = await asyncio.gather(*(client.score_member(member) for member in members(f"g{step}", [at, at])))
            assert all(outcome.result.valid for outcome in outcomes)
        await client.aclose()
    assert client.trace.write_failures == 3 and not path.exists()
    assert [record.message for record in caplog.records if "run trace not written" in record.message] != []
    assert len([record for record in caplog.records if "run trace" in record.message]) == 1  # logged once


def test_no_trace_path_records_nothing_and_pid_names_a_process_file(tmp_path):
    assert RewardClient(BridgeConfig(), LocalTransport()).trace is None
    client = RewardClient(BridgeConfig(trace_path=str(tmp_path / "run-{pid}.json")), LocalTransport())
    assert client.trace.path == tmp_path / f"run-{os.getpid()}.json"

"""``grrm score --trace`` for real: the local Serve application (deployments/local.yaml: 2 vLLM-CPU replicas,
the session's deployment) scores a small dataset over HTTP and the run's trace is the one grrm plan replays:
one step of the groups sent (not the bad rows, which never leave), whole groups at their send time, each
with the engine tokens vLLM reported for it."""

from __future__ import annotations

import time

import pytest

from cluster.planning.replay import replay, runs_of
from cluster.planning.trace import RunTrace
from grrm_cli.main import main

from .test_score_vllm import DEMO, bad_rows, output_rows, write_dataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_grrm_score_records_the_run_trace_grrm_plan_replays(local_app, tmp_path):
    url = local_app[0]
    rows = DEMO[:8] + bad_rows()
    source = write_dataset(tmp_path / "groups.jsonl", rows)
    path = tmp_path / "trace.json"
    before = time.time()
    assert main(["score", str(source), "-o", str(tmp_path / "scored.jsonl"), "--url", url, "--tenant", "trace-run",
                 "--trace", str(path)]) == 0
    after = time.time()
    scored = [row for row in output_rows(tmp_path / "scored.jsonl") if row["valid"]]
    assert len(scored) == 8

    trace = RunTrace.model_validate_json(path.read_text())
    print(f"{path.stat().st_size} bytes: {path.read_text()[:600]}")
    assert trace.run == "trace-run" and not trace.synthetic
    assert trace.group_size == max(len(row["candidates"]) for row in DEMO[:8])
    # The 8 groups go out at once (16 in flight): one step, opened in this test, nothing after it.
    (step,) = trace.steps
    assert before <= step.start_s <= after and step.training_s == 0.0
    assert 0 < step.generation_s <= after - before
    groups = step.groups
    assert sorted(len(group.members_at) for group in groups) == sorted(len(row["candidates"]) for row in DEMO[:8])
    for group in groups:  # a whole group arrives at once, within the step
        assert len(set(group.members_at)) == 1 and 0.0 <= group.members_at[0] <= step.generation_s
    # vLLM reports each group's usage: the trace keeps prompt + completion tokens, as the output's columns say.
    assert sorted(group.tokens for group in groups) == sorted(
        float(row["prompt_tokens"] + row["completion_tokens"]) for row in scored)

    result = replay(runs_of([trace]), seconds_per_group=1.0, cold_start_s=5.0, replicas=2)
    assert result.peak_replicas == 2 and result.exposed_s_mean > 0

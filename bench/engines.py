"""What the project's engine layer costs: each engine against its library's own plain batch call.

- transformers: :class:`~cluster.engines.transformers.TransformersEngine` (micro-batcher, per-row
  sampling, stop checks and regex constraints) against one plain ``model.generate`` over the same
  left-padded batch, as a transformers user writes it (``min_new_tokens`` for fixed lengths,
  ``do_sample``/``temperature``/``top_p`` for sampling, xgrammar's own Hugging Face logits
  processor for the regex). Greedy and sampled, float32 and bfloat16, batches of 1, 8 and 32, with
  and without a regex constraint (the GQM verdict regex).
- vLLM: :class:`~cluster.engines.vllm.VLLMEngine` (``AsyncLLM``, one request per prompt) against
  vLLM's offline ``LLM.generate`` over the same prompts (each side in its own process).

Same model, prompts and answer lengths on both sides (fixed lengths without a constraint; with the
regex, rows end when the verdict is complete). Every measured batch brings prompts of new lengths,
hence new padded shapes, as a service's batches do; ``shapes: repeated`` rows re-run one batch for
contrast (shape-specific setup costs show as the gap). Each transformers batch runs on both sides
back to back, alternating which goes first. Targets: at batch 32 without a constraint the engine
keeps >= 70% of plain ``generate``'s tokens/s; bfloat16 on fresh shapes is no slower than float32.

    .venv/bin/python -m bench.engines             # writes bench/results/engines.json
    .venv/bin/python -m bench.engines --quick     # seconds: transformers only, small batches
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import machine, print_table, write_json
from bench.gqm_vs_sqm import SOURCES, candidates_for
from cluster import gqm
from cluster.engines import EngineConfig, SamplingSettings, apply_chat_template, make_engine
from cluster.tiny_model import ensure_tiny_model

GROUP_SIZE = 4
REGEX = gqm.verdict_regex(GROUP_SIZE)
TARGET_ENGINE_VS_PLAIN = 0.7
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    """One measured configuration (both sides run it)."""

    mode: str  # greedy | sampled
    constraint: str  # none | regex
    batch: int
    shapes: str = "fresh"  # fresh | repeated

    def sampling(self, answer_tokens: int) -> SamplingSettings:
        sampled = self.mode == "sampled"
        return SamplingSettings(
            temperature=1.0 if sampled else 0.0,
            top_p=0.95 if sampled else 1.0,
            max_tokens=answer_tokens,
            seed=0 if sampled else None,
            regex=REGEX if self.constraint == "regex" else None,
            ignore_eos=self.constraint == "none",  # fixed answer lengths; a verdict ends itself
        )


class PromptSource:
    """GQM prompts that no earlier batch had: batch ``k`` pads to a width no other batch has."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.batches = 0

    def batch(self, size: int) -> list[str]:
        k = self.batches
        self.batches += 1
        prompts = []
        for j in range(size):
            source, base = SOURCES[(k + j) % len(SOURCES)]
            # The first row grows by two words per batch: the widest prompt, so the padded width, is new.
            filler = " ".join(f"w{k}x{j}y{i}" for i in range(2 * k + 1 if j == 0 else (k + j) % 7))
            message = gqm.build_group_prompt(f"{source} {filler}".strip(), candidates_for(base, GROUP_SIZE), "en", "zh")
            prompts.append(apply_chat_template(self.tokenizer, message))
        return prompts


def cases(batches: list[int], quick: bool) -> list[Case]:
    found = [Case(mode, constraint, batch) for batch in batches for mode in ("greedy", "sampled")
             for constraint in ("none", "regex")]
    if not quick:
        found += [Case(mode, "none", max(batches), "repeated") for mode in ("greedy", "sampled")]
    return found


# -- transformers ---------------------------------------------------------------------------------


class PlainGenerate:
    """One ``model.generate`` over a left-padded batch, as a transformers user writes it."""

    def __init__(self, model_dir: str, dtype: str, device: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = torch.tensor(eos if isinstance(eos, list) else [eos], device=device)
        self.compiled_regex = None

    def _regex_processor(self) -> Any:
        import xgrammar as xgr

        if self.compiled_regex is None:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab,
                                                      stop_token_ids=self.eos.tolist())
            self.compiled_regex = xgr.GrammarCompiler(info).compile_regex(REGEX)
        return xgr.contrib.hf.LogitsProcessor(self.compiled_regex)

    def run(self, prompts: list[str], case: Case, answer_tokens: int) -> int:
        """Generate and decode the batch; returns completion tokens (each row up to its eos)."""
        torch = self.torch
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        encoded = encoded.to(self.model.device)
        kwargs: dict[str, Any] = {"max_new_tokens": answer_tokens, "do_sample": case.mode == "sampled"}
        if case.mode == "sampled":
            kwargs.update(temperature=1.0, top_p=0.95)
        if case.constraint == "regex":
            kwargs["logits_processor"] = [self._regex_processor()]
        else:
            kwargs["min_new_tokens"] = answer_tokens
        with torch.inference_mode():
            output = self.model.generate(**encoded, **kwargs)
        new = output[:, encoded["input_ids"].shape[1]:]
        self.tokenizer.batch_decode(new, skip_special_tokens=True)
        is_eos = torch.isin(new, self.eos)
        lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, new.shape[1])
        return int(lengths.sum())


async def transformers_rows(model_dir: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes:
        plain = PlainGenerate(model_dir, dtype, args.device)
        engine = make_engine(EngineConfig(kind="transformers", model=model_dir, dtype=dtype, device=args.device,
                                          engine_kwargs={"max_batch_size": max(args.batches)}))
        await engine.start()
        try:
            source = PromptSource(engine.tokenizer)
            warm = source.batch(2)
            for case in (Case("greedy", "none", 2), Case("sampled", "regex", 2)):
                plain.run(warm, case, 4)
                await engine.generate(warm, case.sampling(4))
            for number, case in enumerate(cases(args.batches, args.quick)):
                totals = {"plain": [0, 0.0], "engine": [0, 0.0]}
                repeated = source.batch(case.batch) if case.shapes == "repeated" else None
                for round_ in range(args.rounds):
                    prompts = repeated or source.batch(case.batch)
                    order = ("plain", "engine") if (number + round_) % 2 == 0 else ("engine", "plain")
                    for side in order:
                        started = time.perf_counter()
                        if side == "plain":
                            tokens = plain.run(prompts, case, args.answer_tokens)
                        else:
                            generations = await engine.generate(prompts, case.sampling(args.answer_tokens))
                            tokens = sum(g.completion_tokens for g in generations)
                        totals[side][0] += tokens
                        totals[side][1] += time.perf_counter() - started
                rows += pair_rows("transformers", dtype, case, totals, args.rounds)
        finally:
            await engine.stop()
            del plain
    return rows


def pair_rows(engine: str, dtype: str, case: Case, totals: dict[str, list], rounds: int) -> list[dict[str, Any]]:
    """The two sides of one case as table rows; the engine row carries the ratio."""
    rows = []
    for side, (tokens, wall) in totals.items():
        rows.append({"engine": engine, "dtype": dtype, "mode": case.mode, "constraint": case.constraint,
                     "batch": case.batch, "shapes": case.shapes, "side": side, "batches": rounds,
                     "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else float("nan")})
    base, ours = rows if rows[0]["side"] != "engine" else rows[::-1]
    ours["engine_vs_plain"] = ours["tokens_per_s"] / base["tokens_per_s"]
    return [base, ours]


# -- vLLM: each side in its own process ---------------------------------------------------------


def vllm_config(model_dir: str, dtype: str) -> EngineConfig:
    # As deployments/local.yaml runs vLLM-CPU; no prefix caching, so no side reuses a prompt's work.
    return EngineConfig(kind="vllm", model=model_dir, dtype=dtype, max_model_len=4096, enable_prefix_caching=False,
                        max_num_batched_tokens=8192, engine_kwargs={"enforce_eager": True})


async def vllm_side(side: str, model_dir: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One side of the vLLM comparison, in this process: totals per case."""
    from cluster.engines.vllm import apply_cpu_env_defaults, engine_args_kwargs, sampling_params_kwargs

    apply_cpu_env_defaults()
    config = vllm_config(model_dir, args.vllm_dtype)
    if side == "engine":
        engine = make_engine(config)
        await engine.start()
        tokenizer = engine.tokenizer

        async def run(prompts: list[str], sampling: SamplingSettings) -> int:
            return sum(g.completion_tokens for g in await engine.generate(prompts, sampling))
    else:
        from vllm import LLM, SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        kwargs = engine_args_kwargs(config)
        kwargs.pop("enable_log_requests", None)  # AsyncLLM's only (LLM logs no requests)
        llm = LLM(**kwargs)
        tokenizer = llm.get_tokenizer()

        async def run(prompts: list[str], sampling: SamplingSettings) -> int:
            params = SamplingParams(**sampling_params_kwargs(sampling),
                                    structured_outputs=StructuredOutputsParams(regex=sampling.regex)
                                    if sampling.regex else None)
            inputs = [{"prompt_token_ids": tokenizer.encode(p, add_special_tokens=False)} for p in prompts]
            outputs = llm.generate(inputs, params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outputs)
    source = PromptSource(tokenizer)
    results = []
    try:
        await run(source.batch(2), Case("sampled", "regex", 2).sampling(4))
        for case in cases(args.batches, args.quick):
            tokens, wall = 0, 0.0
            repeated = source.batch(case.batch) if case.shapes == "repeated" else None
            for _ in range(args.rounds):
                prompts = repeated or source.batch(case.batch)
                started = time.perf_counter()
                tokens += await run(prompts, case.sampling(args.answer_tokens))
                wall += time.perf_counter() - started
            results.append({"case": case.__dict__, "tokens": tokens, "wall_s": wall})
    finally:
        if side == "engine":
            await engine.stop()
    return results


def vllm_rows(model_dir: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    totals: dict[str, list[dict[str, Any]]] = {}
    for side in ("offline", "engine"):
        command = [sys.executable, "-m", "bench.engines", "--vllm-side", side, "--model", model_dir,
                   "--answer-tokens", str(args.answer_tokens), "--rounds", str(args.rounds),
                   "--vllm-dtype", args.vllm_dtype, "--batches", *map(str, args.batches)]
        if args.quick:
            command.append("--quick")
        completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if completed.returncode != 0:
            raise RuntimeError(f"vLLM side {side} failed:\n{completed.stdout[-2000:]}\n{completed.stderr[-4000:]}")
        totals[side] = json.loads(completed.stdout.strip().splitlines()[-1])
    rows = []
    for offline, ours in zip(totals["offline"], totals["engine"]):
        case = Case(**ours["case"])
        pair = {"plain": [offline["tokens"], offline["wall_s"]], "engine": [ours["tokens"], ours["wall_s"]]}
        rows += pair_rows("vllm", args.vllm_dtype, case, pair, args.rounds)
    return rows


# -- summary ----------------------------------------------------------------------------------------


def targets(rows: list[dict[str, Any]], largest: int) -> dict[str, Any]:
    """The engine's two targets, read off the transformers rows at the largest batch: throughput at least
    TARGET_ENGINE_VS_PLAIN of the plain batch call's, and bfloat16 no slower than float32."""
    def engine_rows(**match):
        return [r for r in rows if r["engine"] == "transformers" and r["side"] == "engine" and r["batch"] == largest
                and r["shapes"] == "fresh" and all(r[k] == v for k, v in match.items())]

    ratios = {f"{r['dtype']}/{r['mode']}": r["engine_vs_plain"] for r in engine_rows(constraint="none")}
    summary: dict[str, Any] = {"batch": largest, "engine_vs_plain": ratios,
                               "engine_vs_plain_min": min(ratios.values()) if ratios else None}
    summary["engine_vs_plain_met"] = summary["engine_vs_plain_min"] is not None and \
        summary["engine_vs_plain_min"] >= TARGET_ENGINE_VS_PLAIN
    bf16_vs_fp32 = {}
    for mode in ("greedy", "sampled"):
        by_dtype = {r["dtype"]: r["tokens_per_s"] for r in engine_rows(constraint="none", mode=mode)}
        if {"float32", "bfloat16"} <= set(by_dtype):
            bf16_vs_fp32[mode] = by_dtype["bfloat16"] / by_dtype["float32"]
    summary["bf16_vs_fp32_fresh"] = bf16_vs_fp32
    summary["bf16_no_slower_met"] = bool(bf16_vs_fp32) and min(bf16_vs_fp32.values()) >= 1.0
    return summary


COLUMNS = ["engine", "dtype", "mode", "constraint", "batch", "shapes", "side", "tokens", "wall_s", "tokens_per_s",
           "engine_vs_plain"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the tiny model, built if missing)")
    parser.add_argument("--device", default="auto", help="transformers device: auto (cuda if present), cpu, cuda")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="measured batches per case and side")
    parser.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=None,
                        help="include vLLM (default: when vllm imports, and not --quick)")
    parser.add_argument("--vllm-dtype", default="float32")
    parser.add_argument("--vllm-side", choices=["offline", "engine"], help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="seconds: transformers only, batches 1 and 8, 8 answer tokens, one batch per case")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.answer_tokens, args.rounds = [1, 8], 8, 1
        args.vllm = bool(args.vllm)
    model_dir = str(ensure_tiny_model(args.model))
    if args.vllm_side:  # a child process: one vLLM side, JSON on the last line
        print(json.dumps(asyncio.run(vllm_side(args.vllm_side, model_dir, args))))
        return 0
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.vllm is None:
        import importlib.util

        args.vllm = importlib.util.find_spec("vllm") is not None
    rows = asyncio.run(transformers_rows(model_dir, args))
    if args.vllm:
        rows += vllm_rows(model_dir, args)
    print_table(rows, COLUMNS)
    summary = targets(rows, max(args.batches))
    print(json.dumps(summary, indent=2))
    result = {"device": args.device, "model": "tiny random-weight Qwen2 (cluster.tiny_model)" if args.model is None
              else args.model, "answer_tokens": args.answer_tokens, "targets": summary, "rows": rows,
              "simulated": False}
    path = write_json("engines", result, {"machine": machine(), **vars(args)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""deployments/grrm.yaml's own engine and scoring blocks, scoring the demo groups on this machine.

The GPU smoke run's check that the production config itself starts and scores (scripts/gpu_smoke.sh).
Only what this machine lacks is swapped, and each swap is printed and written with its reason:

- the model: where grrm.yaml's checkpoint is neither a directory nor in the hub cache nor served by
  the hub here, the tiny random-weight model (built with grrm.yaml's context); a random model never
  ends an answer nor writes a verdict, so its answers are cut short (``max_answer_tokens``), verdict
  repair writes the verdict, and one retry is enough;
- the engine: where vLLM cannot be imported, the transformers engine (vLLM's batch settings and its
  priority scheduler have no transformers counterpart; its micro-batch takes ``max_num_seqs``);
- the GPU: where torch sees no CUDA device, the engine runs on the CPU (``replicas.gpus_per_rank`` 0).

Everything else (dtype, context, prefix caching, GPU memory share, temperatures, limits) is grrm.yaml's.
A table and ``bench/results/production_config.json``: groups scored, valid verdicts, seconds.

A run with a swap is a run of grrm.yaml's blocks on what the machine has, NOT a run of the production
config: it ends with a line saying so and exit status 3 (``SWAPPED_EXIT``), which scripts/gpu_smoke.sh
reports as such; 0 only where nothing was swapped and every group got a verdict; 1 where one did not.

    .venv/bin/python -m bench.production_config                 # the 20 demo groups
    .venv/bin/python -m bench.production_config --quick          # 4 groups
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import machine, print_table, write_json
from cluster.engines.model_source import ModelNotFoundError, resolve_model
from cluster.protocol.schema import GroupRequest
from deployments.config import AppConfig, load_app_config

ROOT = Path(__file__).resolve().parent.parent
GRRM_YAML = ROOT / "deployments" / "grrm.yaml"
DEMO_GROUPS = ROOT / "data" / "demo_groups.jsonl"
# A random model's answers: long enough for an analysis and the repair to follow it.
TINY_MODEL_ANSWER_TOKENS = 128
# Exit status of a run that scored with swaps: the production config itself did not run (not a pass,
# not a failure; scripts/gpu_smoke.sh's "incomplete" status).
SWAPPED_EXIT = 3
# How the verdict line of a run with swaps starts (scripts/gpu_smoke.sh repeats the line in its summary).
NOT_RUN = "production config NOT run: swapped"


@dataclass(frozen=True)
class Swap:
    """One setting of grrm.yaml that this machine cannot run as shipped."""

    field: str
    shipped: Any
    here: Any
    why: str


def machine_config(config: AppConfig, *, model_found: bool, vllm_importable: bool, cuda_device: bool,
                   tiny_model: str) -> tuple[AppConfig, list[Swap]]:
    """``config`` with only what this machine lacks swapped, and the swaps (pure)."""
    engine = config.engine.model_dump()
    scoring = config.scoring.model_dump()
    replicas = config.replicas.model_dump()
    swaps: list[Swap] = []

    def swap(block: dict[str, Any], name: str, field: str, value: Any, why: str) -> None:
        if block.get(field) != value:
            swaps.append(Swap(f"{name}.{field}", block.get(field), value, why))
            block[field] = value

    if not model_found:
        swap(engine, "engine", "model", tiny_model, "the checkpoint is not on this machine nor reachable")
        random_model = "a random-weight model never ends an answer nor writes a verdict"
        swap(scoring, "scoring", "max_answer_tokens", TINY_MODEL_ANSWER_TOKENS, random_model)
        swap(scoring, "scoring", "verdict_repair", True, random_model)
        swap(scoring, "scoring", "retries", 1, random_model)
    if engine["kind"] == "vllm" and not vllm_importable:
        no_vllm = "vLLM is not installed here"
        swap(engine, "engine", "kind", "transformers", no_vllm)
        swap(engine, "engine", "scheduling", "fifo", no_vllm + " (its priority scheduler)")
        kwargs = dict(engine["engine_kwargs"])
        if engine["max_num_seqs"] is not None:
            kwargs["max_batch_size"] = engine["max_num_seqs"]
        swap(engine, "engine", "engine_kwargs", kwargs, no_vllm + " (max_num_seqs: the micro-batch)")
        swap(engine, "engine", "max_num_seqs", None, no_vllm)
        swap(engine, "engine", "max_num_batched_tokens", None, no_vllm)
    if not cuda_device and config.replicas.gpus_per_rank > 0:
        swap(replicas, "replicas", "gpus_per_rank", 0.0, "no CUDA device here: the engine runs on the CPU")
    changed = config.model_copy(update={"engine": type(config.engine).model_validate(engine),
                                        "scoring": type(config.scoring).model_validate(scoring),
                                        "replicas": type(config.replicas).model_validate(replicas)})
    return AppConfig.model_validate(changed.model_dump()), swaps  # validated again, as a deployment would be


def verdict(row: dict[str, Any], swaps: list[Swap]) -> tuple[int, str]:
    """The run's exit status and its last line: 1 where a group got no verdict; ``SWAPPED_EXIT`` where
    anything was swapped (grrm.yaml's blocks scored, but not the production config); 0 only for the
    production config as shipped, every group valid."""
    if row["valid"] != row["groups"]:
        return 1, (f"[production-config] FAILED: {row['groups'] - row['valid']} of {row['groups']} groups got no "
                   f"verdict ({', '.join(row['failures']) or 'no failure kind'})")
    if swaps:
        return SWAPPED_EXIT, (f"[production-config] {NOT_RUN} {', '.join(item.field for item in swaps)} (grrm.yaml's "
                              f"blocks scored {row['valid']} of {row['groups']} groups on what this machine has)")
    return 0, f"[production-config] production config ran as shipped: {row['valid']} of {row['groups']} groups valid"


def demo_groups(count: int) -> list[GroupRequest]:
    """The first ``count`` demo groups (data/demo_groups.jsonl)."""
    rows = [json.loads(line) for line in DEMO_GROUPS.read_text().splitlines() if line.strip()]
    return [GroupRequest.model_validate({key: row[key] for key in ("group_id", "source", "candidates", "src_lang",
                                                                    "trg_lang")}) for row in rows[:count]]


async def score(config: AppConfig, groups: list[GroupRequest]) -> dict[str, Any]:
    """Start the engine, score the groups at once (as a replica's batch would), stop it."""
    from cluster.engines import make_engine
    from cluster.scorer import GroupScorer

    started = time.perf_counter()
    engine = make_engine(config.replica_engine())
    await engine.start()
    ready = time.perf_counter()
    try:
        results = await GroupScorer(engine, config.scoring, replica="production-config").score_groups(groups)
    finally:
        await engine.stop()
    return {
        "engine": config.engine.kind, "model": config.engine.model, "dtype": config.engine.dtype,
        "groups": len(groups), "valid": sum(result.valid for result in results),
        "failures": sorted({result.failure for result in results if not result.valid and result.failure}),
        "start_s": round(ready - started, 2), "score_s": round(time.perf_counter() - ready, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.production_config", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=GRRM_YAML, help="a Serve config file (default: grrm.yaml)")
    parser.add_argument("--groups", type=int, default=20, help="demo groups to score (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="4 groups")
    parser.add_argument("--tiny-model", type=Path, default=ROOT / "models" / "tiny-grrm-long",
                        help="where the stand-in model is built when the checkpoint is missing")
    args = parser.parse_args(argv)
    config = load_app_config(args.config)
    try:
        resolve_model(config.engine.model)
        model_found = True
    except ModelNotFoundError as error:
        print(f"[production-config] {error}")
        model_found = False
    vllm_importable = importlib.util.find_spec("vllm") is not None
    config, swaps = machine_config(config, model_found=model_found, vllm_importable=vllm_importable,
                                   cuda_device=_cuda_device(), tiny_model=str(args.tiny_model))
    if not model_found:
        from cluster.tiny_model import build_tiny_model

        build_tiny_model(args.tiny_model, max_positions=max(config.engine.max_model_len or 0, 8192))
    for item in swaps:
        print(f"[production-config] swapped {item.field}: {item.shipped!r} -> {item.here!r} ({item.why})")
    row = asyncio.run(score(config, demo_groups(4 if args.quick else args.groups)))
    print_table([row], ["engine", "dtype", "groups", "valid", "start_s", "score_s"])
    write_json("production_config", [row], meta={"config": str(args.config), "swaps": [asdict(s) for s in swaps],
                                                 "production_config_ran": not swaps, "machine": machine()})
    # Every group answered with a verdict (the tiny model's come from repair, a real one's on its own), and
    # only with nothing swapped is that a run of the production config.
    status, line = verdict(row, swaps)
    print(line)
    return status


def _cuda_device() -> bool:
    """Whether torch sees a CUDA device here."""
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    raise SystemExit(main())

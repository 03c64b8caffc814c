"""TEST SUPPORT: the TRL adapter in one rank of a real ``torch.distributed`` group, as TRL calls it.

    python -m cpu_harness.trl_ranks --url URL --rank R --world N --port P --out rank-R.json

Each rank holds its slice of one global batch (``num_generations`` consecutive completions per
prompt, the slices equal and in rank order, as TRL's sampler lays them out), so a group may
straddle two ranks. The ranks join a gloo process group, then call one ``GRRMReward`` each on an
event loop in a thread of its own (TRL's async reward path), twice, with a ``trainer_state``. Each
writes its rewards, the run id its adapter used and its logged metrics to ``--out``.

:func:`score_in_child` is what ``trl.experimental``'s async trainer does with a reward function:
pickle it into a spawned process and call it there once per complete group, without a trainer state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import threading
from pathlib import Path
from typing import Any

GROUP = 4  # num_generations
GROUPS = 3  # per global batch: with 2 ranks of 6, group 1 straddles them
SOURCE, SRC_LANG, TRG_LANG = "The cat sleeps on the warm roof.", "en", "de"


def global_batch(call: int) -> list[str]:
    """The completions of one global batch: distinct texts, so every group has something to compare."""
    return [f"Die Katze {call}-{group}-{member} schläft auf dem warmen Dach."
            for group in range(GROUPS) for member in range(GROUP)]


def columns(count: int) -> dict[str, list[str]]:
    return {"source": [SOURCE] * count, "src_lang": [SRC_LANG] * count, "trg_lang": [TRG_LANG] * count}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch.distributed as distributed

    from grrm_client.adapters.trl import GRRMReward

    distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                                   world_size=args.world)
    reward = GRRMReward(url=args.url, num_generations=GROUP, extractor="none", deadline_s=120)
    loop = asyncio.new_event_loop()  # TRL awaits async reward functions on a loop in a thread of its own
    threading.Thread(target=loop.run_forever, daemon=True).start()
    metrics: list[tuple[str, float]] = []
    calls = []
    for call in range(2):
        batch = global_batch(call)
        width = len(batch) // args.world
        mine = batch[args.rank * width:(args.rank + 1) * width]
        coroutine = reward(prompts=["p"] * width, completions=mine, completion_ids=None, trainer_state=object(),
                           log_metric=lambda name, value: metrics.append((name, value)), **columns(width))
        calls.append(asyncio.run_coroutine_threadsafe(coroutine, loop).result())
    args.out.write_text(json.dumps({"rank": args.rank, "run_id": reward._run_id, "rewards": calls,
                                    "metrics": metrics}))
    distributed.barrier()
    distributed.destroy_process_group()
    return 0


def score_in_child(pickled_reward: bytes, completions: list[str]) -> list[Any]:
    """Unpickle a reward function and score one complete group with it, as the async trainer's
    rollout worker does (keyword arguments, no trainer state; run in a spawned process)."""
    reward = pickle.loads(pickled_reward)
    count = len(completions)
    return asyncio.run(reward(prompts=["p"] * count, completions=completions, completion_ids=[[0]] * count,
                              **columns(count)))


if __name__ == "__main__":
    raise SystemExit(main())

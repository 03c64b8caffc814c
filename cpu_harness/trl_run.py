"""TEST SUPPORT: TRL's real ``GRPOTrainer`` trains a tiny policy on the CPU with GRRM rewards.

    python -m cpu_harness.trl_run --url http://127.0.0.1:8000/grrm --workdir /tmp/trl-run [--steps 2]

The tiny random policy (``cluster.tiny_model``, printable vocabulary) writes random text, so its
whole completion is read as the translation (extractor ``none``). The dataset has TRL's ``prompt``
column and the adapter's ``source``, ``src_lang`` and ``trg_lang`` columns, and ``ref_text``,
``ref_lang`` and ``notes`` where a row has them (null in the others). The only GRRM-specific
line is the reward function: ``GRRMReward(url=..., num_generations=...)``. Prints one JSON line per
entry of TRL's log history (``{"log": {...}}``), then ``{"done": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cluster.tiny_model import build_tiny_model

SOURCES = [
    ("en", "de", "The weather is nice today."),
    ("en", "zh", "Where is the train station?"),
    ("de", "en", "Ich habe keine Zeit."),
    ("fr", "en", "Il pleut des cordes."),
    ("en", "ja", "Thank you for your help."),
    ("ru", "en", "Тише едешь, дальше будешь."),
    ("en", "fr", "It is raining cats and dogs."),
    ("zh", "en", "画蛇添足"),
]
# A reference and notes for some sources (the others have none): the recipe's context on real rows.
REFERENCES = {"The weather is nice today.": ("Das Wetter ist heute schön.", "de", "informal register"),
              "Ich habe keine Zeit.": ("I have no time.", "en", None)}


def dataset(rows: int):
    """TRL's conversational prompts, with the columns the GRRM adapter reads."""
    from datasets import Dataset

    records = []
    for i in range(rows):
        src_lang, trg_lang, source = SOURCES[i % len(SOURCES)]
        ref_text, ref_lang, notes = REFERENCES.get(source, (None, None, None))
        records.append({
            "prompt": [{"role": "user", "content": f"Translate from {src_lang} to {trg_lang}: {source}"}],
            "source": source,
            "src_lang": src_lang,
            "trg_lang": trg_lang,
            "ref_text": ref_text,
            "ref_lang": ref_lang,
            "notes": notes,
        })
    return Dataset.from_list(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the GRRM service's base URL (route prefix included)")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--deadline-s", type=float, help="per reward call (default: the TRL adapter's)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from trl import GRPOConfig, GRPOTrainer

    from grrm_client.adapters.trl import GRRMReward

    policy = build_tiny_model(args.workdir / "tiny-policy", seed=1, printable_vocab=True)
    deadline = {} if args.deadline_s is None else {"deadline_s": args.deadline_s}
    reward = GRRMReward(url=args.url, num_generations=args.num_generations, extractor="none", **deadline)
    config = GRPOConfig(
        output_dir=str(args.workdir / "out"),
        use_cpu=True,
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=16,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=str(policy),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset(args.steps * args.prompts_per_step * 2),
    )
    trainer.train()
    for entry in trainer.state.log_history:
        print(json.dumps({"log": entry}), flush=True)
    print(json.dumps({"done": {"global_step": trainer.state.global_step, "run_id": reward._run_id}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

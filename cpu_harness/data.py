"""TEST SUPPORT: a small machine-translation dataset in verl's parquet format.

One row per source sentence, as verl's ``RLHFDataset`` reads it (``data.prompt_key=prompt``):

* ``prompt``: the chat messages asking the policy for a translation (one user message);
* ``data_source``, ``ability``, ``reward_model`` (``ground_truth`` unused: GRRM needs none);
* ``extra_info``: ``index`` plus what the GRRM bridge reads, ``source``, ``src_lang``,
  ``trg_lang``, and for some sources a reference ``ref_text`` with ``ref_lang`` and ``notes``
  (null in the others; the bridge's default ``*_key`` options point there).

CLI: ``python -m cpu_harness.data OUT_DIR [--rows N]`` writes ``train.parquet`` and ``val.parquet``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# (src_lang, trg_lang, source): idioms and traps, like the GRRM demo groups.
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("en", "de", "It's raining cats and dogs."),
    ("en", "zh", "I have a frog in my throat."),
    ("en", "de", "Break a leg tonight!"),
    ("en", "zh", "The grass is always greener on the other side."),
    ("de", "en", "Das ist nicht mein Bier."),
    ("zh", "en", "他这个人就是嘴硬心软。"),
    ("fr", "en", "Il pleut des cordes."),
    ("en", "de", "Kill two birds with one stone."),
    ("ru", "en", "Без труда не вытащишь и рыбку из пруда."),
    ("en", "zh", "Actions speak louder than words."),
    ("en", "de", "The early bird catches the worm."),
    ("ja", "en", "猿も木から落ちる。"),
)

# A reference translation and notes for some sources (the others have none): what a real MT dataset may carry.
REFERENCES: dict[str, tuple[str, str, str | None]] = {
    "It's raining cats and dogs.": ("Es regnet in Strömen.", "de", "an idiom: translate what it means"),
    "Das ist nicht mein Bier.": ("That's not my problem.", "en", None),
}

LANGUAGE_NAMES = {"en": "English", "de": "German", "zh": "Chinese", "fr": "French", "ru": "Russian", "ja": "Japanese"}
DATA_SOURCE = "grrm-cpu-harness-mt"


def translation_request(source: str, src_lang: str, trg_lang: str) -> str:
    """The user message: a codeblock-think MT instruction (the policy's answer ends in a code block)."""
    return (
        f"Translate the following {LANGUAGE_NAMES[src_lang]} text into {LANGUAGE_NAMES[trg_lang]}. "
        f"Think first, then give the translation in a code block.\n\n{source}"
    )


def rows(count: int, offset: int = 0) -> list[dict]:
    """``count`` dataset rows, cycling through :data:`SOURCES` from ``offset``.

    Every prompt differs: from the second cycle on, the request carries its cycle number, so a
    rollout dump without group ids (legacy and experimental trainers) still groups by prompt.
    """
    result = []
    for index in range(count):
        cycle, position = divmod(offset + index, len(SOURCES))
        src_lang, trg_lang, source = SOURCES[position]
        request = translation_request(source, src_lang, trg_lang) + (f" ({cycle + 1})" if cycle else "")
        result.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": request}],
                "ability": "translation",
                "reward_model": {"style": "model", "ground_truth": ""},
                "extra_info": {"index": index, "source": source, "src_lang": src_lang, "trg_lang": trg_lang,
                               **dict(zip(("ref_text", "ref_lang", "notes"), REFERENCES.get(source, (None,) * 3)))},
            }
        )
    return result


def write_dataset(directory: str | Path, train_rows: int = 8, val_rows: int = 4) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` into ``directory``; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    train, val = directory / "train.parquet", directory / "val.parquet"
    pq.write_table(pa.Table.from_pylist(rows(train_rows)), train)
    pq.write_table(pa.Table.from_pylist(rows(val_rows, offset=train_rows)), val)
    return train, val


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpu_harness.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--rows", type=int, default=8, help="training rows (validation: half as many)")
    args = parser.parse_args(argv)
    for path in write_dataset(args.directory, args.rows, max(1, args.rows // 2)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

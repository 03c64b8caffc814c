"""Shared fixtures for the engine tests: the tiny random-weight model, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import gqm

# A few GQM groups, inline: the engine tests read no data files.
GROUPS = (
    ("en", "zh", "I have a frog in my throat.", ["我嗓子有点哑。", "我喉咙里有只青蛙。", "我嗓子不太舒服。"]),
    ("de", "en", "Das ist nicht mein Bier.", ["That's not my problem.", "That is not my beer."]),
    ("zh", "en", "雨后春笋", ["springing up like mushrooms after rain", "rain after spring", "bamboo shoots"]),
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model directory (random weights, ~1 s to build), shared by the session."""
    from cluster.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-grrm", seed=0)


@pytest.fixture(scope="session")
def user_messages() -> list[str]:
    """User messages of different lengths: GQM group prompts and short free text."""
    messages = [gqm.build_group_prompt(source, candidates, src, trg) for src, trg, source, candidates in GROUPS]
    return messages + ["Hello!", "Translate into German: the cat sat on the mat."]


@pytest.fixture(scope="session")
def pick_stop():
    """A stop string that occurs in ``text``: two ASCII letters, from its second half if possible.

    Plain ASCII keeps the test away from partial UTF-8 characters, which incremental detokenizers
    may render differently mid-stream than in the final text.
    """
    import re

    def pick(text: str) -> str:
        for start in (len(text) // 2, 0):
            match = re.search(r"[A-Za-z]{2}", text[start:])
            if match:
                return match.group()
        pytest.skip(f"no ASCII letters in the output {text!r}")

    return pick

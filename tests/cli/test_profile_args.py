"""``grrm profile``'s command line, checked before any service is reached: each mistake is named by its
option (the measuring itself: tests/cli/test_profile_command.py)."""

from __future__ import annotations

import json

import pytest

from grrm_cli.main import main

MADE = ["--group-size", "2", "--source-words", "3", "--candidate-words", "3"]


@pytest.mark.parametrize("argv, message", [
    ([*MADE], "give --url URL or --app-name NAME (or both)"),
    (["--url", "http://127.0.0.1:9", *MADE], "--url alone cannot read the replicas' cold starts"),
    (["--app-name", "a", "--concurrency", "1,x", *MADE], "--concurrency: '1,x' is not a list of integers"),
    (["--app-name", "a", "--concurrency", "1,0", *MADE], "--concurrency: Input should be greater than or equal to 1"),
    (["--app-name", "a", "--concurrency", "2,2", *MADE], "--concurrency: Value error, 2 given more than once"),
    (["--app-name", "a", "--concurrency", "1,4", "--groups-per-point", "3", *MADE],
     "--groups-per-point: 3 is fewer than concurrency 4"),
    (["--app-name", "a", "--group-size", "1", "--source-words", "3", "--candidate-words", "3"],
     "--group-size: Input should be greater than or equal to 2"),
    (["--app-name", "a", "--group-size", "3"], "give --sample FILE, or --group-size, --source-words and --candidate-words"),
    (["--app-name", "a", "--tenant", "no way", *MADE], "--tenant: String should match pattern"),
    (["--app-name", "a", "--cold-start-s", "-1", *MADE], "--cold-start-s: must not be negative"),
    (["--app-name", "a", "--max-failures", "-1", *MADE], "--max-failures: Input should be greater than or equal to 0"),
])
def test_a_mistake_is_named_by_its_option(argv, message, tmp_path, capsys):
    assert main(["profile", *argv, "--out", str(tmp_path / "p.json")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_a_sample_row_that_is_not_a_group_is_named_by_its_row_and_column(tmp_path, capsys):
    sample = tmp_path / "sample.jsonl"
    rows = [{"source": "Hallo", "candidates": ["Hi", "Hello"], "src_lang": "de", "trg_lang": "en"},
            {"source": "Tschüss", "src_lang": "de", "trg_lang": "en"}]
    sample.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = str(tmp_path / "p.json")
    assert main(["profile", "--app-name", "a", "--sample", str(sample), "--out", out]) == 2
    assert f"--sample {sample}: row 1: candidates: missing or null" in capsys.readouterr().err
    assert main(["profile", "--app-name", "a", "--sample", str(sample), "--group-size", "3", "--out", out]) == 2
    assert "--sample gives the groups: drop --group-size" in capsys.readouterr().err
    assert main(["profile", "--app-name", "a", "--sample", str(tmp_path / "none.jsonl"), "--out", out]) == 2
    assert "--sample: " in capsys.readouterr().err

"""One writer per output (``grrm_cli/output_lock.py``): a second ``grrm score`` on an output that a
first one is writing is refused at once, naming the first, and leaves its files alone; a writer that
crashed does not block the next run. The scorer is the scripted engine in-process (no Ray): this is
about the command's files, not about scores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grrm_cli.output_lock import OutputLocked, lock_path, output_lock

ROOT = Path(__file__).resolve().parents[2]
GROUPS = 24


def test_the_lock_is_exclusive_names_its_holder_and_goes_with_its_writer(tmp_path):
    output = tmp_path / "scored.jsonl"
    with output_lock(output):
        assert json.loads(lock_path(output).read_text())["pid"] == os.getpid()
        with pytest.raises(OutputLocked, match=rf"is being written by another grrm score \(pid {os.getpid()} on "):
            with output_lock(output):
                pass
    assert not lock_path(output).exists()
    with output_lock(output):  # free again
        pass


def inputs(tmp_path: Path) -> tuple[Path, Path]:
    source = tmp_path / "groups.jsonl"
    source.write_text("".join(json.dumps({"group_id": f"g{i}", "source": f"Source {i}.", "src_lang": "en",
                                          "trg_lang": "de", "candidates": [f"a {i} [q=2]", f"b {i} [q=8]"]}) + "\n"
                              for i in range(GROUPS)))
    config = tmp_path / "scripted.yaml"
    # 0.15 s a group, 2 at a time: a run of ~2 s writes its first part well before its end.
    config.write_text(yaml.safe_dump({"applications": [{"name": "grrm", "import_path": "deployments.app:build_app",
                                                        "args": {"engine": {"kind": "scripted", "scripted": {
                                                            "per_prompt_s": 0.15}}}}]}))
    return source, config


def score(source: Path, output: Path, config: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "grrm_cli", "score", str(source), "-o", str(output), "--config",
                             str(config), "--concurrency", "2", "--part-rows", "4"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def wait_for_parts(output: Path, timeout_s: float = 60) -> None:
    parts = output.with_name(output.name + ".parts")
    deadline = time.monotonic() + timeout_s
    while not any(parts.glob("part-*")):
        assert time.monotonic() < deadline, "the first run wrote no part"
        time.sleep(0.05)


def test_a_second_writer_is_refused_naming_the_first_and_the_first_completes(tmp_path):
    source, config = inputs(tmp_path)
    output = tmp_path / "scored.jsonl"
    first = score(source, output, config)
    wait_for_parts(output)
    # Held mid-run while the second starts (its start-up may outlast the whole first run on a loaded machine).
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = score(source, output, config)
        _, refused = second.communicate(timeout=60)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2, refused
    assert f"is being written by another grrm score (pid {first.pid} on" in refused, refused
    assert "Traceback" not in refused
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-2000:]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["group_id"] for row in rows] == [f"g{i}" for i in range(GROUPS)] and all(row["valid"] for row in rows)
    assert not lock_path(output).exists() and not output.with_name(output.name + ".parts").exists()


def test_a_crashed_writer_does_not_block_the_next_run(tmp_path):
    source, config = inputs(tmp_path)
    output = tmp_path / "scored.jsonl"
    crashed = score(source, output, config)
    wait_for_parts(output)
    crashed.send_signal(signal.SIGKILL)
    crashed.wait(timeout=30)
    assert lock_path(output).exists()  # left behind, but no longer held
    rerun = score(source, output, config)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-2000:]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(row["group_id"] for row in rows) == sorted(f"g{i}" for i in range(GROUPS))

"""scripts/gpu_smoke.sh tells the truth on the CPU: a step it skips makes the run "incomplete" (exit 3),
a step that fails makes it fail (exit 1), and a dry run says nothing ran; never "all steps passed"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# runs_last: each run starts the script's Python steps (~18 s of CPU), tests/conftest.py.
pytestmark = pytest.mark.runs_last


def smoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    return subprocess.run(["bash", "scripts/gpu_smoke.sh", "run", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


def test_skipped_steps_end_incomplete_not_passed(tmp_path):
    # No CUDA GPU here: both steps skip, with their reasons, and the run is not a pass.
    run = smoke(tmp_path, "--steps", "tensor-parallel,sleep-mode")
    assert run.returncode == 3, run.stderr
    assert "tensor-parallel: SKIPPED, it needs 2 CUDA GPUs" in run.stderr
    assert "sleep-mode: SKIPPED, it needs a CUDA GPU" in run.stderr
    assert "incomplete: no step failed, but these did not run:" in run.stderr
    assert "all steps passed" not in run.stderr
    assert "SKIPPED" in (tmp_path / "serve-tp2.log").read_text()


def test_a_failed_step_fails_the_run_and_grrm_check_finds_no_gpu_here(tmp_path):
    run = smoke(tmp_path, "--steps", "grrm-check")
    assert run.returncode == 1, run.stderr
    assert "FAILED steps: grrm-check" in run.stderr
    # grrm check ran against grrm.yaml with the 7B's config.json in a hub cache of its own: the model was
    # found there, and only the missing GPU is a problem on this machine.
    report = (tmp_path / "grrm-check.txt").read_text()
    assert "[PROBLEM] gpus: this machine shows 0 GPU(s)" in report
    assert "[ok] model: double7/Qwen2.5-7B-GRRM: in the hub cache" in report and "[ok] auth" in report


def test_a_dry_run_says_nothing_ran(tmp_path):
    run = smoke(tmp_path, "--dry-run")
    assert run.returncode == 0 and "dry run: the steps above were listed, none ran" in run.stderr
    assert "all steps passed" not in run.stderr

"""scripts/gpu_smoke.sh tells the truth on the CPU: a step it skips makes the run "incomplete" (exit 3),
a step that fails makes it fail (exit 1), a production-config step that swapped what the machine lacks is
not a run of the production config, and a dry run says nothing ran; never "all steps passed"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.production_config import SWAPPED_EXIT, Swap, verdict

ROOT = Path(__file__).resolve().parent.parent
# runs_last: each run starts the script's Python steps (~18 s of CPU), tests/conftest.py.
pytestmark = pytest.mark.runs_last


def smoke(tmp_path: Path, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": python}
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


SWAPS = [Swap("engine.model", "double7/Qwen2.5-7B-GRRM", "/m", "not here"),
         Swap("engine.kind", "vllm", "transformers", "no vLLM")]


def python_whose_production_config_ends(tmp_path: Path, status: int) -> str:
    """This Python, but for ``-m bench.production_config``: a stand-in (its engine run costs a minute here)
    that prints the real module's last line for SWAPS and ends with ``status`` (tests/
    test_bench_production_config.py runs the module's own verdict)."""
    row = {"groups": 4, "valid": 4 if status != 1 else 3, "failures": [] if status != 1 else ["parse_failed"]}
    line = verdict(row, SWAPS if status == SWAPPED_EXIT else [])[1]
    stand_in = tmp_path / "python"
    stand_in.write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m bench.production_config" ]; then echo {line!r}; exit {status}; fi
exec {sys.executable} "$@"
""")
    stand_in.chmod(0o755)
    return str(stand_in)


def test_a_swapped_production_config_is_reported_as_not_run_never_as_a_pass(tmp_path):
    run = smoke(tmp_path, "--steps", "production-config",
                python=python_whose_production_config_ends(tmp_path, SWAPPED_EXIT))
    assert run.returncode == 3, run.stderr
    summary = run.stderr.splitlines()[-2:]
    assert summary[0] == "[gpu-smoke] production config NOT run: swapped engine.model, engine.kind " \
                         "(grrm.yaml's blocks scored 4 of 4 groups on what this machine has)", summary
    assert "production-config (swapped)" in summary[1] and "incomplete" in summary[1]
    assert "FAILED" not in run.stderr and "all steps passed" not in run.stderr


def test_the_production_config_as_shipped_is_not_reported_swapped(tmp_path):
    run = smoke(tmp_path, "--steps", "production-config", python=python_whose_production_config_ends(tmp_path, 0))
    assert run.returncode == 3, run.stderr  # the other steps were not asked for
    assert "NOT run" not in run.stderr and "production-config (swapped)" not in run.stderr
    assert "production-config" not in run.stderr.splitlines()[-1]


def test_a_production_config_without_every_verdict_fails_the_run(tmp_path):
    run = smoke(tmp_path, "--steps", "production-config", python=python_whose_production_config_ends(tmp_path, 1))
    assert run.returncode == 1, run.stderr
    assert "FAILED steps: production-config" in run.stderr

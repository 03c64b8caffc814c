"""``grrm plan`` end to end through the console script's main(): traces in, table, answers and JSON out."""

from __future__ import annotations

import json

import yaml

from cluster.planning.plan import SERVE_TARGETS
from cluster.planning.trace import synthetic_trace
from deployments.config import AppConfig
from grrm_cli.main import main


def test_grrm_plan_replays_a_trace_file_beside_a_synthetic_run(tmp_path, capsys):
    trace = tmp_path / "run-a.json"
    trace.write_text(synthetic_trace("run-a", groups=16, group_size=4, generation_s=60.0, training_s=120.0,
                                     steps=3).model_dump_json())
    out = tmp_path / "plan.json"
    status = main(["plan", "--trace", str(trace), "--synthetic", "batch=16,n=4,gen_s=60,train_s=120,steps=3,offset_s=90",
                   "--seconds-per-group", "1", "--cold-start-s", "30", "--max-replicas", "4", "--within-pct", "100",
                   "--gpus", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    plan = json.loads(out.read_text())
    # Fixed 1..4, the autoscaling grid and Serve's policy at each target, up to 4 replicas and again capped at the
    # 2 GPUs.
    assert plan["simulated"] and len(plan["candidates"]) == 4 + 2 * (16 + len(SERVE_TARGETS))
    assert plan["offline_bound"]["replica_seconds_per_step"] > 0 and "offline bound" in printed
    assert plan["unlimited"]["replicas"] == 4 and plan["best_within_gpus"]["peak_replicas"] <= 2
    # What it prints to paste is what it wrote, and it is the cheapest candidate within the bound.
    pasted = yaml.safe_load(printed.split("app config (deployments/grrm.yaml's `config`):\n")[1].split("wrote")[0])
    assert pasted == plan["config"]
    config = AppConfig.model_validate({"engine": {"kind": "scripted"}, **pasted})  # the project's own config model
    assert (config.replicas.autoscaling is not None) == (plan["cheapest_within"]["pool"] == "autoscaled")
    bound = 2 * plan["unlimited"]["exposed_s_mean"]
    cheapest = min(row["replica_seconds_per_step"] for row in plan["candidates"] if row["exposed_s_mean"] <= bound)
    assert plan["cheapest_within"]["replica_seconds_per_step"] == cheapest
    assert "SIMULATED" in printed and "cheapest within 100%" in printed


def test_grrm_plan_plots_the_recommended_pool_over_time(tmp_path, capsys):
    png = tmp_path / "plan.png"
    status = main(["plan", "--synthetic", "batch=8,n=2,gen_s=20,train_s=20,steps=2", "--seconds-per-group", "1",
                   "--cold-start-s", "5", "--max-replicas", "2", "--plot", str(png)])
    assert status == 0 and f"wrote {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_grrm_plan_names_what_is_wrong_with_its_input(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"run": "r", "group_size": 2, "steps": [
        {"start_s": 0, "generation_s": 10, "training_s": 5, "groups": [{"members_at": [-3, 1]}]}]}))
    common = ["--seconds-per-group", "1", "--cold-start-s", "30"]
    assert main(["plan", "--trace", str(bad), *common]) == 2
    assert "steps.0.groups.0: Value error, members_at: -3.0 is before the step's start" in capsys.readouterr().out
    assert main(["plan", "--synthetic", "batch=4,n=2,gen_s=10,train_s=5,stepz=2", *common]) == 2
    assert "--synthetic: unknown key 'stepz'" in capsys.readouterr().out
    assert main(["plan", "--synthetic", "batch=four,n=2,gen_s=10,train_s=5,steps=2", *common]) == 2
    assert "batch='four' is not an integer" in capsys.readouterr().out
    assert main(["plan", "--trace", str(tmp_path / "missing.json"), *common]) == 2
    assert "missing.json: No such file" in capsys.readouterr().out

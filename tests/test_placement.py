"""Replica placement follows from the config (deployments/placement.py), and a placement that
cannot run is refused when the config is read, naming the setting: never a replica Serve retries."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.engines.config import EngineConfig
from deployments.app import replica_options
from deployments.config import AppConfig
from deployments.placement import PlacementError, plan_placement
from grrm_handles.availability import missing_resources


def engine(**settings) -> EngineConfig:
    return EngineConfig(kind=settings.pop("kind", "vllm"), model="m", **settings)


def test_one_rank_holds_its_gpu_itself_and_needs_no_executor():
    placement = plan_placement(engine(), num_cpus=2, gpus_per_rank=1)
    assert (placement.ranks, placement.executor) == (1, None)
    assert placement.serve_options() == {"ray_actor_options": {"num_cpus": 2, "num_gpus": 1}}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_single_node_parallel_ranks_are_processes_of_a_replica_holding_every_gpu(kind):
    placement = plan_placement(engine(kind=kind, tensor_parallel_size=2, pipeline_parallel_size=2),
                               num_cpus=4, gpus_per_rank=1)
    assert (placement.ranks, placement.executor, placement.gpus) == (4, "mp", 4)
    assert placement.serve_options() == {"ray_actor_options": {"num_cpus": 4, "num_gpus": 4}}


def test_cpu_tensor_parallel_runs_its_ranks_as_processes_without_gpus():
    placement = plan_placement(engine(tensor_parallel_size=2), num_cpus=0.5, gpus_per_rank=0)
    assert placement.executor == "mp" and placement.gpus == 0
    assert placement.serve_options() == {"ray_actor_options": {"num_cpus": 0.5}}


def test_the_ray_executor_gets_a_packed_placement_group_with_one_gpu_bundle_per_rank():
    placement = plan_placement(engine(tensor_parallel_size=4, pipeline_parallel_size=2,
                                      distributed_executor_backend="ray"), num_cpus=2, gpus_per_rank=1)
    options = placement.serve_options()
    assert options["placement_group_bundles"] == [{"CPU": 2, "GPU": 1}] + [{"GPU": 1}] * 7
    assert options["placement_group_strategy"] == "PACK"  # may span nodes: multi-node TP/PP
    assert options["ray_actor_options"] == {"num_cpus": 2}  # the actor sits in bundle 0
    assert placement.gpus == 8
    # Two 4-GPU nodes can hold it (PACK); no single one could.
    nodes = [{"CPU": 8, "GPU": 4}, {"CPU": 8, "GPU": 4}]
    assert missing_resources(options["placement_group_bundles"], "PACK", nodes) == {}
    assert missing_resources(options["placement_group_bundles"], "STRICT_PACK", nodes) == {"GPU": 4}


@pytest.mark.parametrize(
    ("settings", "gpus_per_rank", "names"),
    [
        ({"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}, 0, "engine.distributed_executor_backend"),
        ({"tensor_parallel_size": 2}, 0.5, "replicas.gpus_per_rank"),
    ],
)
def test_placements_that_cannot_run_are_refused_naming_the_setting(settings, gpus_per_rank, names):
    with pytest.raises(PlacementError, match=names.replace(".", r"\.")):
        plan_placement(engine(**settings), num_cpus=1, gpus_per_rank=gpus_per_rank)
    args = {"engine": {"kind": "vllm", "model": "m", **settings}, "replicas": {"gpus_per_rank": gpus_per_rank}}
    with pytest.raises(ValidationError, match=names.replace(".", r"\.")):
        AppConfig.model_validate(args)


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"kind": "sglang", "tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
         "engine.distributed_executor_backend"),
        ({"kind": "transformers", "tensor_parallel_size": 2}, "engine.tensor_parallel_size"),
        ({"kind": "vllm", "engine_kwargs": {"distributed_executor_backend": "mp"}},
         "engine.engine_kwargs.distributed_executor_backend"),
    ],
)
def test_engine_settings_that_cannot_run_are_refused_naming_the_setting(settings, names):
    with pytest.raises(ValidationError, match=names.replace(".", r"\.")):
        AppConfig.model_validate({"engine": {"model": "m", **settings}})


def test_replica_options_carry_the_placement_and_the_replica_environment():
    config = AppConfig.model_validate({
        "engine": {"kind": "vllm", "model": "m", "tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
        "replicas": {"num_replicas": 1, "num_cpus": 1, "env_vars": {"VLLM_X": "1"}},
    })
    options = replica_options(config)
    assert options["placement_group_bundles"] == [{"CPU": 1, "GPU": 1}, {"GPU": 1}]
    assert options["ray_actor_options"] == {"num_cpus": 1, "runtime_env": {"env_vars": {"VLLM_X": "1"}}}
    assert config.gpus_per_replica == 2


def test_the_builder_refuses_a_ray_executor_on_cpu_before_serve_starts_anything():
    from deployments.app import build_app

    args = {"engine": {"kind": "vllm", "model": "m", "tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
            "replicas": {"gpus_per_rank": 0}}
    with pytest.raises(ValidationError, match=r"engine\.distributed_executor_backend: 'ray' needs GPU replicas"):
        build_app(args)


@pytest.mark.parametrize("settings", [{}, {"tensor_parallel_size": 2}, {"tensor_parallel_size": 2,
                                                                          "distributed_executor_backend": "ray"}])
def test_custom_resources_reach_the_actor_and_its_first_bundle(settings):
    # A replica asking for the reward pods' own resource can never land on a trainer node's free GPU.
    placement = plan_placement(engine(**settings), num_cpus=4, gpus_per_rank=1, resources={"grrm_worker": 1})
    options = placement.serve_options()
    assert options["ray_actor_options"]["resources"] == {"grrm_worker": 1}
    if placement.placement_group_bundles is not None:
        assert options["placement_group_bundles"][0] == {"CPU": 4, "GPU": 1, "grrm_worker": 1}
        assert all("grrm_worker" not in bundle for bundle in options["placement_group_bundles"][1:])

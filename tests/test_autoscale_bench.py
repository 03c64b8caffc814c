"""bench.autoscale's policy names, without Ray: what pool each row of its table runs."""

import pytest

from bench.autoscale import Workload, app_config, engine_work_bounds, serve_target


def test_policy_names_set_the_pools_bounds_and_targets():
    load = Workload()
    assert engine_work_bounds("engine_work", load) == (1, load.max_replicas)
    assert engine_work_bounds("engine_work_2", load) == (1, 2)
    assert engine_work_bounds("engine_work_min0", load) == (0, load.max_replicas)
    autoscaling = app_config("engine_work_min0_2", load).replicas.autoscaling
    assert (autoscaling.policy, autoscaling.min_replicas, autoscaling.max_replicas) == ("engine_work", 0, 2)
    for misspelt in ("engine_work_mni0", "engine_work_2_3", "engine_work_min0_x"):
        with pytest.raises(ValueError, match="policy"):
            engine_work_bounds(misspelt, load)
    assert serve_target("serve_default") == 64 and serve_target("serve_default_4") == 4
    assert app_config("fixed", load).replicas.num_replicas == load.max_replicas

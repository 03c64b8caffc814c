"""Builds vLLM's own engine configuration from sets of engine-argument keyword arguments (JSON on
stdin: {name: kwargs}) and writes what vLLM made of each as JSON ({name: values}) to the file named by
its argument (vLLM logs to stdout), as ``AsyncLLM.from_engine_args`` would build it:
``AsyncEngineArgs(**kwargs).create_engine_config(UsageContext.ENGINE_CONTEXT)``.

Run in a process of its own by tests/engines/test_vllm_engine_args.py: importing vLLM sets process-wide
state (its environment defaults, logging) that other tests in the same process must not inherit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    from cluster.engines.vllm import apply_cpu_env_defaults

    apply_cpu_env_defaults()
    from vllm.config.scheduler import SchedulerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    built = {}
    for name, kwargs in json.load(sys.stdin).items():
        config = AsyncEngineArgs(**kwargs).create_engine_config(UsageContext.ENGINE_CONTEXT)
        built[name] = {
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "scheduler_policy": str(config.scheduler_config.policy),
            "max_model_len": config.model_config.max_model_len,
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "enable_prefix_caching": config.cache_config.enable_prefix_caching,
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
            "distributed_executor_backend": str(config.parallel_config.distributed_executor_backend),
            "default_max_num_seqs": SchedulerConfig.DEFAULT_MAX_NUM_SEQS,
        }
    Path(sys.argv[1]).write_text(json.dumps(built))

if __name__ == "__main__":
    main()

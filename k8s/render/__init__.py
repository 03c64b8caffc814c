"""Render the KubeRay manifests of the reward cluster (and the verl job that shares its Ray cluster).

One source of truth: the Serve application embedded in the RayService (``serveConfigV2``) is the
application of ``deployments/grrm.yaml``, loaded from that file; only the model, the tensor
parallel size and the replica range are overridden, from the arguments. With no arguments the
output is the committed default (``k8s/*.yaml``); ``--check`` exits non-zero when a committed
file differs from a fresh render.

    python -m k8s.render                       # re-render the committed defaults into k8s/
    python -m k8s.render --check               # CI: committed files == fresh render
    python -m k8s.render --tp 4 --min-replicas 2 --max-replicas 16 \\
        --gpu-product NVIDIA-A100-SXM4-80GB --out /tmp/grrm-a100   # a custom deployment

What is rendered (see ``k8s/README.md`` for the design and the operations):

* ``namespace.yaml``                 the namespace;
* ``secret-hf-token.yaml``           Hugging Face token Secret template (placeholder value);
* ``secret-api-token.yaml``          bearer token Secret template for the HTTP API (placeholder);
* ``secret-redis-password.yaml``    the GCS Redis's password Secret template (placeholder);
* ``redis.yaml``                    that Redis in the cluster (the default; ``--redis-address`` for yours);
* ``model-cache.yaml``              the cache volume's PVC (ReadWriteMany) and the Job that fills it;
* ``rayservice-grrm.yaml``           the RayService: CPU-only head, ``grrm-gpus`` reward workers
                                     (one or more TP replicas per pod), ``policy-gpus`` trainer
                                     workers, the Ray autoscaler (v2) on;
* ``metrics-service.yaml``           a headless Service over every Ray pod's metrics port;
* ``prometheus-scrape-config.yaml``  a ConfigMap with a Prometheus scrape job for that Service;
* ``verl-job.yaml``                  a RayJob running verl's ``main_ppo`` on the RayService's
                                     Ray cluster (``clusterSelector``), with the trainer bridge;
* ``submit-verl-job.sh``             the same job through ``ray job submit`` to the RayService's
                                     stable head Service (the alternative to ``clusterSelector``).

Modules, one job each: :mod:`~k8s.render.options` (what a render depends on),
:mod:`~k8s.render.app` (the Serve application and the reward pods' sizing),
:mod:`~k8s.render.ray_cluster` (the RayService), :mod:`~k8s.render.placement` (which Ray demand fits which
group, checked on every render; each group's Ray node shape), :mod:`~k8s.render.scheduling` (where Kubernetes
may put each pod), :mod:`~k8s.render.volumes` (the cache volume, the download Job), :mod:`~k8s.render.redis`
(the GCS's Redis), :mod:`~k8s.render.observability` (metrics Service,
Prometheus scrape job), :mod:`~k8s.render.verl_job` (the verl RayJob and submit script; its Hydra
overrides in ``verl_job.yaml``), :mod:`~k8s.render.kube` (what every manifest shares),
:mod:`~k8s.render.manifests` (every file of a render), :mod:`~k8s.render.cli` (the command line).
"""

from k8s.render.cli import check, main, write
from k8s.render.manifests import render
from k8s.render.options import RenderOptions
from k8s.render.placement import node_shapes, worker_groups

__all__ = ["RenderOptions", "check", "main", "node_shapes", "render", "worker_groups", "write"]

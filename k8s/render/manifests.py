"""Every manifest of a render, as {file name: text}."""

from __future__ import annotations

from k8s.render.app import grrm_application, load_serve_config, serve_config_for, sized_application, sizing_for
from k8s.render.kube import documents_text, namespace, secret
from k8s.render.observability import metrics_service, prometheus_config
from k8s.render.options import RenderOptions, check_options
from k8s.render.placement import check_placement, node_shape
from k8s.render.ray_cluster import ray_groups, rayservice
from k8s.render.redis import in_cluster, redis_address, redis_objects
from k8s.render.verl_job import rayjob, submit_script
from k8s.render.volumes import model_cache_claim, model_download_job


def render(options: RenderOptions | None = None) -> dict[str, str]:
    """Every manifest as {file name: text}."""
    options = options or RenderOptions()
    base = load_serve_config()
    sizing = sizing_for(options, sized_application(options, base))
    check_options(options, sizing)
    serve_config = serve_config_for(options, base)
    shapes = {name: node_shape(name, group["rayStartParams"]) for name, group in ray_groups(options, sizing).items()}
    check_placement(shapes, grrm_application(serve_config), options.replicas_per_worker)
    hf_note = (
        "# A template: put the real token in with\n"
        f"#   kubectl -n {options.namespace} create secret generic {options.hf_token_secret} "
        "--from-literal=token=hf_...\n"
        "# (applying this file as is stores the placeholder).\n"
    )
    api_note = (
        "# A template: the bearer token every /v1 request must carry (an empty value turns auth off).\n"
        f"#   kubectl -n {options.namespace} create secret generic {options.api_token_secret} "
        '--from-literal=token="$(openssl rand -hex 32)"\n'
    )
    redis_note = (
        "# A template: the password of the Redis that backs GCS fault tolerance"
        + (" (redis.yaml's, which reads it from here)" if in_cluster(options) else " (yours)") + ".\n"
        f"#   kubectl -n {options.namespace} create secret generic {options.redis_password_secret} "
        + ('--from-literal=password="$(openssl rand -hex 32)"\n' if in_cluster(options)
           else "--from-literal=password=...\n")
    )
    redis_yaml_note = (
        "# The Redis the head's GCS keeps its state in (GCS fault tolerance): one pod, its append-only file on a\n"
        "# volume. It makes a first deploy work; it is not highly available: in production render with\n"
        "# --redis-address redis://<your HA Redis> (k8s/README.md, Head failure).\n"
    )
    # The reward model and the policy, where they are hub ids (a path is the user's to fill).
    hub_models = [model for model in (sizing.model, options.policy_model) if not model.startswith(("/", "."))]
    storage_class = options.model_cache_storage_class
    apply_cache = (
        "envsubst '$GRRM_RWX_STORAGE_CLASS' < k8s/model-cache.yaml | kubectl apply -f -"
        if storage_class == RenderOptions.model_cache_storage_class else "kubectl apply -f k8s/model-cache.yaml"
    )
    cache_note = (
        "# The cache volume every engine pod mounts at /models (weights in /models/hf = HF_HOME, vLLM's compile\n"
        "# cache in /models/vllm-cache), and a Job that fills it once, before the RayService starts, so no replica\n"
        "# pod downloads the weights itself. Its storage class must mount ReadWriteMany (k8s/README.md, Weights):\n"
        + ("#   export GRRM_RWX_STORAGE_CLASS=standard-rwx   # GKE Filestore; AKS: azurefile-csi; EKS: your EFS class\n"
           if storage_class == RenderOptions.model_cache_storage_class else "")
        + f"#   {apply_cache}\n"
        f"#   kubectl -n {options.namespace} wait --for=condition=complete --timeout=2h job/grrm-model-download\n"
    )
    job_note = (
        f"# clusterSelector needs the RayService's active RayCluster name (it carries a generated suffix):\n"
        f"#   export GRRM_RAY_CLUSTER=$(kubectl -n {options.namespace} get rayservice {options.name} "
        "-o jsonpath='{.status.activeServiceStatus.rayClusterName}')\n"
        "#   envsubst '$GRRM_RAY_CLUSTER' < k8s/verl-job.yaml | kubectl apply -f -\n"
    )
    return {
        "namespace.yaml": documents_text(namespace(options)),
        "secret-hf-token.yaml": documents_text(
            secret(options, options.hf_token_secret, "model-download", "REPLACE_WITH_HF_TOKEN"), note=hf_note
        ),
        "secret-api-token.yaml": documents_text(
            secret(options, options.api_token_secret, "api-auth", "REPLACE_WITH_API_TOKEN"), note=api_note
        ),
        **(
            {"secret-redis-password.yaml": documents_text(
                secret(options, options.redis_password_secret, "gcs-storage", "REPLACE_WITH_REDIS_PASSWORD",
                       key="password"),
                note=redis_note)}
            if redis_address(options) else {}
        ),
        **({"redis.yaml": documents_text(*redis_objects(options), note=redis_yaml_note)} if in_cluster(options) else {}),
        **(
            {"model-cache.yaml": documents_text(
                model_cache_claim(options),
                *([model_download_job(options, hub_models)] if hub_models else []), note=cache_note)}
            if options.model_cache_pvc else {}
        ),
        "rayservice-grrm.yaml": documents_text(rayservice(options, serve_config, sizing)),
        "metrics-service.yaml": documents_text(metrics_service(options)),
        "prometheus-scrape-config.yaml": documents_text(prometheus_config(options)),
        "verl-job.yaml": documents_text(rayjob(options, sizing), note=job_note),
        "submit-verl-job.sh": submit_script(options, sizing),
    }

"""The KubeRay manifests in k8s/: schema-valid, fresh, and one source of truth with deployments/grrm.yaml.

* every RayService / RayJob validates against the KubeRay v1.7 CRD's ``openAPIV3Schema``
  (``k8s/crds/``, copied from KubeRay), made strict the way ``kubectl apply --validate=strict`` is:
  an unknown field anywhere is an error;
* KubeRay's own admission rules that a schema cannot express (KubeRay's Go validation, mirrored);
* core objects (Namespace, Secret, Service, ConfigMap, and every pod template) validate against
  Kubernetes' schemas shipped in ``kubernetes-validate`` (offline);
* the embedded ``serveConfigV2`` application is deployments/grrm.yaml's, and validates as
  ``deployments.config.AppConfig``; other sizes render valid manifests with the right GPUs;
* ``python -m k8s.render --check`` passes on the committed files and catches drift.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deployments.config import AppConfig
from k8s import render as k8s_render
from k8s.render import app as k8s_app
from k8s.render import options as k8s_options
from k8s.render import placement as k8s_placement
from k8s.render import ray_cluster, verl_job

PROJECT_ROOT = Path(__file__).resolve().parent.parent
K8S_DIR = PROJECT_ROOT / "k8s"
CRD_DIR = K8S_DIR / "crds"
GRRM_YAML = PROJECT_ROOT / "deployments" / "grrm.yaml"
# The oldest Kubernetes the manifests are checked against, and the newest kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
CRD_FILES = {
    "RayService": "ray.io_rayservices.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayCluster": "ray.io_rayclusters.yaml",
}
CORE_KINDS = {"Namespace", "Secret", "Service", "ConfigMap", "PersistentVolumeClaim", "Job", "StatefulSet"}
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# ------------------------------------------------------------------------------------------
# Helpers


def strict_schema(schema: Any) -> Any:
    """A CRD schema where objects with declared properties accept no other field.

    The API server prunes unknown fields silently (or rejects them with strict field
    validation); a plain JSON-schema validator ignores them. Closing every object that lists
    its properties (and does not preserve unknown fields) catches misspelt fields here.
    """
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict_schema(value) for key, value in schema.items()}
    if (
        result.get("type") == "object"
        and isinstance(result.get("properties"), dict)
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


@pytest.fixture(scope="module")
def crd_validators() -> dict[str, jsonschema.Draft7Validator]:
    if not CRD_DIR.is_dir():
        pytest.fail(f"KubeRay CRDs not found at {CRD_DIR} (they are part of the repository)")
    validators = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.load((CRD_DIR / name).read_text(), Loader=_Loader)
        assert crd["spec"]["names"]["kind"] == kind
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        assert version["served"] and version["storage"]
        schema = strict_schema(version["schema"]["openAPIV3Schema"])
        jsonschema.Draft7Validator.check_schema(schema)
        validators[kind] = jsonschema.Draft7Validator(schema)
    return validators


def crd_errors(validators: dict[str, jsonschema.Draft7Validator], document: dict[str, Any]) -> list[str]:
    assert document["apiVersion"] == "ray.io/v1", document["apiVersion"]
    validator = validators[document["kind"]]
    return [
        f"{'.'.join(str(part) for part in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def rendered(**overrides: Any) -> dict[str, str]:
    return k8s_render.render(k8s_render.RenderOptions(**overrides))


def yaml_documents(files: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [doc for doc in yaml.safe_load_all(text) if doc]
        for name, text in files.items()
        if name.endswith(".yaml")
    }


def one(files: dict[str, str], name: str) -> dict[str, Any]:
    (document,) = yaml_documents(files)[name]
    return document


def serve_config_of(rayservice: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


def worker_group(rayservice: dict[str, Any], name: str) -> dict[str, Any]:
    groups = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (group,) = [g for g in groups if g["groupName"] == name]
    return group


def ray_custom_resources(params: dict[str, str]) -> dict[str, int]:
    """Parse rayStartParams["resources"] exactly the way Ray's KubeRay autoscaler does."""
    if "resources" not in params:
        return {}
    parsed = json.loads(params["resources"][1:-1].replace("\\", ""))
    assert isinstance(parsed, dict) and all(isinstance(v, int) for v in parsed.values()), parsed
    return parsed


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def kuberay_rule_errors(document: dict[str, Any]) -> list[str]:
    """KubeRay v1.7's admission checks that no schema expresses (utils/validation.go, mirrored)."""
    errors: list[str] = []
    kind, spec, name = document["kind"], document["spec"], document["metadata"]["name"]
    if kind == "RayService":
        if len(name) > 47 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
            errors.append(f"RayService name {name!r}: DNS-1035 label of at most 47 characters")
        upgrade = (spec.get("upgradeStrategy") or {}).get("type")
        if upgrade not in (None, "NewCluster", "NewClusterWithIncrementalUpgrade", "None"):
            errors.append(f"upgradeStrategy.type {upgrade!r}")
        cluster = spec["rayClusterConfig"]
        head_service = cluster["headGroupSpec"].get("headService") or {}
        if (head_service.get("metadata") or {}).get("name"):
            errors.append("headService.metadata.name must not be set in a RayService")
        if cluster.get("upgradeStrategy"):
            errors.append("rayClusterConfig.upgradeStrategy cannot be set for a RayService's cluster")
        errors += cluster_rule_errors(cluster)
    elif kind == "RayJob":
        selector = spec.get("clusterSelector") or {}
        if selector:
            if not selector.get("ray.io/cluster"):
                errors.append("clusterSelector needs a non-empty ray.io/cluster (KubeRay reads only that key)")
            if spec.get("suspend"):
                errors.append("clusterSelector mode cannot be suspended")
            if spec.get("submissionMode") == "SidecarMode":
                errors.append("clusterSelector is not supported in SidecarMode")
            if (spec.get("backoffLimit") or 0) > 0:
                errors.append("backoffLimit is incompatible with clusterSelector")
        elif not spec.get("rayClusterSpec"):
            errors.append("one of rayClusterSpec or clusterSelector must be set")
        if len(name) > 47:
            errors.append("RayJob name: at most 47 characters")
        runtime_env = spec.get("runtimeEnvYAML")
        if runtime_env is not None:
            yaml.safe_load(runtime_env)
        if spec.get("entrypointResources"):
            resources = json.loads(spec["entrypointResources"])
            if not isinstance(resources, dict):
                errors.append("entrypointResources must be a JSON object")
    return errors


def cluster_rule_errors(cluster: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    autoscaling = bool(cluster.get("enableInTreeAutoscaling"))
    v2 = autoscaling and (cluster.get("autoscalerOptions") or {}).get("version") == "v2"
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    for group_name, group in groups:
        params = group.get("rayStartParams") or {}
        if any(params.get(key) for key in ("num-cpus", "num-gpus", "memory", "resources")) and group.get("resources"):
            errors.append(f"{group_name}: resources in both rayStartParams and the resources field")
        if "labels" in params:
            errors.append(f"{group_name}: rayStartParams['labels'] is not supported (use the labels field)")
        for key in ("num-cpus", "num-gpus"):
            if key in params and not params[key].isdigit():
                errors.append(f"{group_name}: rayStartParams[{key!r}] must be a whole number (the autoscaler reads int)")
        try:
            ray_custom_resources(params)
        except Exception as error:  # noqa: BLE001 - report any parse failure
            errors.append(f"{group_name}: rayStartParams['resources'] unreadable by the autoscaler: {error}")
        pod = group["template"]["spec"]
        if not pod.get("containers"):
            errors.append(f"{group_name}: no container")
        if v2 and pod.get("restartPolicy") not in (None, "Never"):
            errors.append(f"{group_name}: restartPolicy must be Never or unset with autoscaler v2")
    for group_name, group in groups[1:]:
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
        if low < 0 or high < 0 or low > high:
            errors.append(f"{group_name}: minReplicas {low} / maxReplicas {high}")
        replicas = group.get("replicas")
        if replicas is not None and not low <= replicas <= high:
            errors.append(f"{group_name}: replicas {replicas} outside [{low}, {high}]")
        if group.get("idleTimeoutSeconds") is not None and not v2:
            errors.append(f"{group_name}: idleTimeoutSeconds needs autoscaler v2")
        if group.get("priority"):
            if not v2:
                errors.append(f"{group_name}: priority needs autoscaler v2")
            if version_tuple(cluster.get("rayVersion") or "0") < (2, 56, 0):
                errors.append(f"{group_name}: priority needs rayVersion >= 2.56.0")
    return errors


def core_errors(document: dict[str, Any]) -> list[str]:
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            errors.append(f"k8s {version}: {document['kind']} {path}: {error.message}")
    return errors


def pod_templates(rayservice: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = {"head": cluster["headGroupSpec"]["template"]}
    for group in cluster["workerGroupSpecs"]:
        templates[group["groupName"]] = group["template"]
    return templates


def validate_all(files: dict[str, str], validators: dict[str, jsonschema.Draft7Validator]) -> None:
    """Every document: CRD schema + KubeRay rules, or Kubernetes' schema; pod templates too."""
    problems: list[str] = []
    for name, documents in yaml_documents(files).items():
        for document in documents:
            if document["apiVersion"].startswith("ray.io/"):
                problems += [f"{name}: {error}" for error in crd_errors(validators, document)]
                problems += [f"{name}: {error}" for error in kuberay_rule_errors(document)]
                templates = pod_templates(document) if document["kind"] == "RayService" else {}
                if document["kind"] == "RayJob" and "submitterPodTemplate" in document["spec"]:
                    templates["submitter"] = document["spec"]["submitterPodTemplate"]
                for group, template in templates.items():
                    pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": group},
                                    "template": template}
                    problems += [f"{name} [{group}]: {error}" for error in core_errors(pod_template)]
            else:
                assert document["kind"] in CORE_KINDS, f"{name}: unexpected kind {document['kind']}"
                problems += [f"{name}: {error}" for error in core_errors(document)]
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def committed() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(K8S_DIR.iterdir()) if path.suffix in (".yaml", ".sh")}


@pytest.fixture(scope="module")
def replica_options():
    """deployments.app.replica_options: how the app maps TP to placement-group bundles."""
    from deployments.app import replica_options

    return replica_options


# ------------------------------------------------------------------------------------------
# The committed files


def test_committed_files_are_exactly_the_render(committed: dict[str, str]) -> None:
    fresh = k8s_render.render()
    assert set(committed) == set(fresh), "k8s/ holds a manifest the renderer does not produce (or misses one)"
    assert k8s_render.check(fresh, K8S_DIR) == []


def test_check_mode_passes_on_the_committed_files() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "k8s.render", "--check"], capture_output=True, text=True, cwd=PROJECT_ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_mode_catches_drift(tmp_path: Path) -> None:
    assert k8s_render.main(["--out", str(tmp_path)]) == 0
    assert k8s_render.main(["--check", "--out", str(tmp_path)]) == 0
    path = tmp_path / "rayservice-grrm.yaml"
    path.write_text(path.read_text().replace("max_replicas: 8", "max_replicas: 9"))
    assert k8s_render.main(["--check", "--out", str(tmp_path)]) == 1
    path.unlink()
    (tmp_path / "verl-job.yaml").write_text("")
    assert k8s_render.check(k8s_render.render(), tmp_path) == ["rayservice-grrm.yaml", "verl-job.yaml"]


def test_committed_manifests_validate(committed: dict[str, str], crd_validators) -> None:
    kinds = {doc["kind"] for docs in yaml_documents(committed).values() for doc in docs}
    assert {"RayService", "RayJob", "Secret", "Service", "ConfigMap"} <= kinds
    validate_all(committed, crd_validators)


def test_schema_checks_are_strict(crd_validators) -> None:
    """A misspelt field or a wrong type is caught, in the CRD part and in the Kubernetes part."""
    rayservice = one(k8s_render.render(), "rayservice-grrm.yaml")
    assert crd_errors(crd_validators, rayservice) == []
    typo = copy.deepcopy(rayservice)
    typo["spec"]["rayClusterConfig"]["enableInTreeAutoScaling"] = True
    assert any("enableInTreeAutoScaling" in error for error in crd_errors(crd_validators, typo))
    wrong_type = copy.deepcopy(rayservice)
    worker_group(wrong_type, "grrm-gpus")["minReplicas"] = "1"
    assert crd_errors(crd_validators, wrong_type)
    bad_probe = copy.deepcopy(rayservice)
    container = worker_group(bad_probe, "grrm-gpus")["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["portt"] = 8000
    assert crd_errors(crd_validators, bad_probe)
    service = one(k8s_render.render(), "metrics-service.yaml")
    service["spec"]["ports"][0]["port"] = "eighty"
    assert core_errors(service)


# ------------------------------------------------------------------------------------------
# One source of truth with deployments/grrm.yaml


def test_embedded_serve_config_is_grrm_yaml(committed: dict[str, str]) -> None:
    source = yaml.safe_load(GRRM_YAML.read_text())
    rayservice = one(committed, "rayservice-grrm.yaml")
    embedded = serve_config_of(rayservice)
    # The render pins the deployments to their groups (the next tests); the rest is grrm.yaml's, key for key.
    assert unpinned(embedded["applications"]) == unpinned(source["applications"])
    assert embedded["proxy_location"] == source["proxy_location"]
    assert embedded["http_options"]["host"] == "0.0.0.0"
    assert embedded["http_options"]["port"] == 8000


# What the render sets to pin each deployment to its worker group.
PINNED_REPLICA_KEYS = ("num_cpus", "resources", "env_vars")


def unpinned(applications: list[dict]) -> list[dict]:
    """The applications without what the render pins: the ingress, the ledger, the replicas' Ray asks."""
    result = []
    for app in applications:
        args = {k: v for k, v in app["args"].items() if k not in ("ingress", "ledger")}
        args["replicas"] = {k: v for k, v in args["replicas"].items() if k not in PINNED_REPLICA_KEYS}
        result.append({**app, "args": args})
    return result


def test_scorer_replicas_ask_for_a_reward_pod_and_no_cpu(committed: dict[str, str], replica_options) -> None:
    """A replica fits a grrm-gpus pod only, and a grrm-gpus pod offers nothing a trainer asks for."""
    rayservice = one(committed, "rayservice-grrm.yaml")
    (application,) = serve_config_of(rayservice)["applications"]
    replicas = application["args"]["replicas"]
    assert replicas["num_cpus"] == 0 and replicas["resources"] == {ray_cluster.GRRM_RESOURCE: 1}
    # Ray would force 1 on a 0-CPU actor anyway; vLLM serves with 1 torch thread.
    assert replicas["env_vars"]["OMP_NUM_THREADS"] == "1"
    actor = replica_options(AppConfig.model_validate(application["args"]))["ray_actor_options"]
    assert actor["num_cpus"] == 0 and actor["resources"] == {ray_cluster.GRRM_RESOURCE: 1}
    assert actor["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    groups = {name: ray_custom_resources(params) for name, params in k8s_placement.worker_groups().items()}
    assert [name for name, custom in groups.items() if ray_cluster.GRRM_RESOURCE in custom] == ["grrm-gpus"]
    reward = worker_group(rayservice, "grrm-gpus")
    assert reward["rayStartParams"]["num-cpus"] == "0"
    # The container keeps its real CPUs: grrm.yaml's num_cpus per replica and 2 per GPU for vLLM's processes.
    source_cpus = yaml.safe_load(GRRM_YAML.read_text())["applications"][0]["args"]["replicas"]["num_cpus"]
    assert reward["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == str(source_cpus + 2)
    # Every group but the trainers' offers no Ray CPU and says how many GPUs it has (Ray would count them).
    for name, params in k8s_placement.worker_groups().items():
        assert "num-gpus" in params, name
        if name != "policy-gpus":
            assert params["num-cpus"] == "0", name


def test_every_ray_demand_fits_exactly_the_group_meant_for_it(committed: dict[str, str]) -> None:
    """So the autoscaler never chooses between groups (no `priority`) and no pod takes the other's work."""
    (application,) = serve_config_of(one(committed, "rayservice-grrm.yaml"))["applications"]
    shapes = k8s_placement.node_shapes()
    found = k8s_placement.demands(application)
    assert set(found) >= {"a scorer replica", "a verl placement-group bundle", "the verl job's driver"}
    for what, (ask, meant) in found.items():
        assert {name for name, shape in shapes.items() if shape.offers(ask)} == meant, what
    assert found["a verl placement-group bundle"][0] == {"CPU": 3, "GPU": 1}


def test_verl_bundle_is_what_verl_asks_for() -> None:
    """verl 0.9.1's resource pool: {"CPU": max_colocate_count, "GPU": 1} per GPU, max_colocate_count 3."""
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed")
    from verl.single_controller.ray.base import ResourcePoolManager

    assert ResourcePoolManager.max_colocate_count == k8s_options.VERL_CPUS_PER_GPU_BUNDLE
    source = Path(importlib.util.find_spec("verl.single_controller.ray.base").origin).read_text()
    assert 'bundle = {"CPU": self.max_colocate_count}' in source and "bundle[device_name] = 1" in source


@pytest.mark.parametrize("per_worker", [1, 2, 4, 8])
def test_a_reward_pod_of_any_size_cannot_hold_verls_bundles(per_worker: int, crd_validators) -> None:
    """replicas_per_worker up to policy_gpus_per_node renders: the rehearsal's 8-GPU reward pod among them."""
    files = rendered(replicas_per_worker=per_worker)
    validate_all(files, crd_validators)
    shapes = k8s_placement.node_shapes(k8s_render.RenderOptions(replicas_per_worker=per_worker))
    reward = shapes["grrm-gpus"]
    assert (reward.num_cpus, reward.num_gpus, reward.resources) == (0, per_worker, {"grrm_worker": per_worker})
    assert reward.add_node_kwargs() == {"num_cpus": 0, "num_gpus": per_worker, "resources": {"grrm_worker": per_worker}}
    assert not reward.offers({"CPU": 3, "GPU": 1}) and not reward.offers({"CPU": 1})
    params = worker_group(one(files, "rayservice-grrm.yaml"), "grrm-gpus")["rayStartParams"]
    assert params == k8s_placement.worker_groups(k8s_render.RenderOptions(replicas_per_worker=per_worker))["grrm-gpus"]


def test_placement_check_refuses_a_group_that_would_mix_the_workloads() -> None:
    options = k8s_render.RenderOptions()
    (application,) = serve_config_of(one(k8s_render.render(), "rayservice-grrm.yaml"))["applications"]
    shapes = k8s_placement.node_shapes(options)
    k8s_placement.check_placement(shapes, application, 1)
    # A reward pod that offers CPUs would take verl's CPU actors.
    with_cpus = {**shapes, "grrm-gpus": dataclasses.replace(shapes["grrm-gpus"], num_cpus=4)}
    with pytest.raises(ValueError, match="verl placement-group bundle .* grrm-gpus"):
        k8s_placement.check_placement(with_cpus, application, 1)
    # A replica that asks for no grrm_worker would fit a trainer node with a free GPU.
    loose = copy.deepcopy(application)
    loose["args"]["replicas"]["resources"] = {}
    with pytest.raises(ValueError, match="scorer replica .* policy-gpus"):
        k8s_placement.check_placement(shapes, loose, 1)
    with pytest.raises(ValueError, match="holds 1 scorer replicas"):
        k8s_placement.check_placement(shapes, application, 2)


def test_replica_resources_the_reward_pods_do_not_offer_are_refused() -> None:
    serve_config = k8s_app.load_serve_config()
    k8s_app.grrm_application(serve_config)["args"]["replicas"]["resources"] = {"accelerator_a100": 1}
    with pytest.raises(ValueError, match=r"replicas\.resources"):
        k8s_app.application_for(k8s_render.RenderOptions(), serve_config)


def test_ingress_and_ledger_run_one_replica_each_on_pods_of_their_own(committed: dict[str, str]) -> None:
    rayservice = one(committed, "rayservice-grrm.yaml")
    (application,) = serve_config_of(rayservice)["applications"]
    groups = {group["groupName"]: group for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    services = groups["grrm-services"]
    pods = services["replicas"]
    assert pods >= 2 and services["minReplicas"] == services["maxReplicas"] == pods
    assert services["rayStartParams"]["num-cpus"] == "0"  # no trainer actor lands there
    assert ray_custom_resources(services["rayStartParams"]) == {k8s_app.SERVICE_RESOURCE: 2}
    for service in ("ingress", "ledger"):
        settings = application["args"][service]
        # >= 2 replicas, at most one per pod, and only the services pods advertise the resource.
        assert settings == {"num_replicas": pods, "num_cpus": 0, "resources": {k8s_app.SERVICE_RESOURCE: 1},
                            "max_replicas_per_node": 1}
    for name, group in groups.items():
        if name != "grrm-services":
            assert k8s_app.SERVICE_RESOURCE not in ray_custom_resources(group["rayStartParams"])


def test_gcs_fault_tolerance_keeps_the_head_state_in_redis(committed: dict[str, str]) -> None:
    cluster = one(committed, "rayservice-grrm.yaml")["spec"]["rayClusterConfig"]
    options = cluster["gcsFaultToleranceOptions"]
    secret_ref = options["redisPassword"]["valueFrom"]["secretKeyRef"]
    secret = one(committed, "secret-redis-password.yaml")
    assert secret_ref == {"name": secret["metadata"]["name"], "key": "password"}
    assert "password" in secret["stringData"]
    # The head settings it had are kept: no work on the head.
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    # An external Redis: no Redis rendered; '' turns GCS fault tolerance off.
    external = rendered(redis_address="redis://redis.example.internal:6379")
    assert "redis.yaml" not in external and "secret-redis-password.yaml" in external
    assert one(external, "rayservice-grrm.yaml")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"][
        "redisAddress"] == "redis://redis.example.internal:6379"
    off = rendered(redis_address="")
    assert "secret-redis-password.yaml" not in off and "redis.yaml" not in off
    assert "gcsFaultToleranceOptions" not in yaml.safe_load(off["rayservice-grrm.yaml"])["spec"]["rayClusterConfig"]


def test_a_first_deploy_brings_its_own_redis(committed: dict[str, str], crd_validators) -> None:
    """The default: a Redis in the cluster at the address the head is given, with the password of the Secret
    the head reads, keeping its data on a volume; in any namespace."""
    service, statefulset = yaml_documents(committed)["redis.yaml"]
    address = one(committed, "rayservice-grrm.yaml")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"][
        "redisAddress"]
    port = service["spec"]["ports"][0]["port"]
    assert address == f"redis://{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:{port}"
    pod = statefulset["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("redis:7")
    password = env_of(pod)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password["name"] == one(committed, "secret-redis-password.yaml")["metadata"]["name"]
    assert password["key"] == "password" and password["optional"] is False
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"  # expanded by the kubelet
    assert args[args.index("--appendonly") + 1] == "yes"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]  # what every default storage class offers
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    files = rendered(namespace="rl", name="grrm2")
    validate_all(files, crd_validators)
    assert one(files, "rayservice-grrm.yaml")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"][
        "redisAddress"] == "redis://grrm2-redis.rl.svc.cluster.local:6379"


def test_embedded_application_validates_as_app_config(committed: dict[str, str]) -> None:
    (application,) = serve_config_of(one(committed, "rayservice-grrm.yaml"))["applications"]
    config = AppConfig.model_validate(application["args"])
    assert application["name"] == "grrm"
    assert application["import_path"] == "deployments.app:build_app"
    assert config.replica_deployment_name == "GRRMReplica"


def test_ray_version_matches_the_project_pin() -> None:
    pyproject = (PROJECT_ROOT / "pyproject.toml").read_text()
    (pinned,) = re.findall(r'"ray\[[a-z,]*serve[a-z,]*\]==([^"]+)"', pyproject)
    assert k8s_render.RenderOptions().ray_version == pinned


# ------------------------------------------------------------------------------------------
# Other sizes


@pytest.mark.parametrize(
    ("tp", "low", "high", "per_worker"),
    [(1, 0, 4, 1), (1, 2, 16, 4), (2, 1, 8, 1), (2, 3, 3, 2), (4, 1, 8, 1), (4, 0, 6, 2), (8, 2, 6, 1)],
)
def test_other_sizes_render_valid_manifests(tp, low, high, per_worker, crd_validators, replica_options) -> None:
    model = "double7/Qwen2.5-7B-GRRM" if tp < 8 else "some-org/GRRM-Qwen2.5-72B"
    files = rendered(
        tensor_parallel_size=tp, min_replicas=low, max_replicas=high, replicas_per_worker=per_worker, model=model
    )
    validate_all(files, crd_validators)
    rayservice = one(files, "rayservice-grrm.yaml")

    # The application is grrm.yaml's with exactly the overrides applied.
    expected = yaml.safe_load(GRRM_YAML.read_text())["applications"][0]
    expected["args"]["engine"]["model"] = model
    expected["args"]["engine"]["tensor_parallel_size"] = tp
    expected["args"]["replicas"]["autoscaling"]["min_replicas"] = low
    expected["args"]["replicas"]["autoscaling"]["max_replicas"] = high
    (application,) = serve_config_of(rayservice)["applications"]
    assert unpinned([application]) == unpinned([expected])
    config = AppConfig.model_validate(application["args"])

    # GPUs: TP (x gpus_per_rank) per replica, per_worker replicas per pod.
    group = worker_group(rayservice, "grrm-gpus")
    container = group["template"]["spec"]["containers"][0]
    gpus = int(config.gpus_per_replica) * per_worker
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == str(gpus)
    assert group["rayStartParams"]["num-gpus"] == str(gpus)
    assert group["minReplicas"] == math.ceil(low / per_worker) == group["replicas"]
    assert group["maxReplicas"] == math.ceil(high / per_worker)
    assert ray_custom_resources(group["rayStartParams"]) == {ray_cluster.GRRM_RESOURCE: per_worker}

    # The replica (deployments/placement.py) fits a worker exactly: GPUs and grrm_worker, no Ray CPU. Its
    # TP ranks are processes of the replica, which holds their GPUs (a pod is one node).
    options = replica_options(config)
    assert "placement_group_bundles" not in options
    actor = options["ray_actor_options"]
    assert actor["num_gpus"] == tp and config.engine.executor == ("mp" if tp > 1 else None)
    assert actor["num_gpus"] * per_worker == int(group["rayStartParams"]["num-gpus"])
    assert actor["num_cpus"] == 0 == int(group["rayStartParams"]["num-cpus"])
    assert actor["resources"] == {ray_cluster.GRRM_RESOURCE: 1}
    # The container has the CPUs grrm.yaml gives a replica, for each replica of the pod.
    assert int(container["resources"]["limits"]["cpu"]) >= expected["args"]["replicas"]["num_cpus"] * per_worker

    # The trainer's group is unchanged by the reward sizing.
    policy = worker_group(rayservice, "policy-gpus")
    assert policy["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_cli_renders_a_custom_size(tmp_path: Path, crd_validators) -> None:
    argv = ["--tp", "4", "--min-replicas", "0", "--max-replicas", "4", "--gpu-product", "NVIDIA-A100-SXM4-80GB"]
    assert k8s_render.main([*argv, "--namespace", "rl", "--out", str(tmp_path)]) == 0
    files = {path.name: path.read_text() for path in tmp_path.iterdir()}
    validate_all(files, crd_validators)
    rayservice = one(files, "rayservice-grrm.yaml")
    assert rayservice["metadata"]["namespace"] == "rl"
    group = worker_group(rayservice, "grrm-gpus")
    assert group["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert (group["minReplicas"], group["maxReplicas"], group["rayStartParams"]["num-gpus"]) == (0, 4, "4")


@pytest.mark.parametrize(
    "overrides",
    [
        {"min_replicas": 5, "max_replicas": 2},  # AppConfig: min > max
        {"tensor_parallel_size": 0},  # AppConfig: TP >= 1
        {"replicas_per_worker": 0},
        {"upgrade_strategy": "Rolling"},
        {"name": "x" * 48},
        {"rollout_tp": 3},
        {"policy_nodes": 0},
        {"policy_nodes": 2, "policy_min_nodes": 3},
        {"redis_address": "http://redis:6379"},
    ],
)
def test_render_refuses_bad_sizes(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        rendered(**overrides)


def test_fractional_gpus_per_pod_are_refused() -> None:
    application = k8s_app.grrm_application(k8s_app.load_serve_config())
    application = copy.deepcopy(application)
    application["args"]["replicas"]["gpus_per_rank"] = 0.5
    application["args"]["engine"]["tensor_parallel_size"] = 1
    with pytest.raises(ValueError, match="whole number"):
        k8s_app.sizing_for(k8s_render.RenderOptions(), application)
    options = k8s_render.RenderOptions(replicas_per_worker=2)
    assert k8s_app.sizing_for(options, application).gpus_per_worker == 1


def test_ray_executor_replicas_spanning_pods_are_refused() -> None:
    application = copy.deepcopy(k8s_app.grrm_application(k8s_app.load_serve_config()))
    application["args"]["engine"]["distributed_executor_backend"] = "ray"
    application["args"]["engine"]["tensor_parallel_size"] = 2  # grrm.yaml's TP 1 runs no executor
    with pytest.raises(ValueError, match=r"engine\.distributed_executor_backend: 'ray'"):
        k8s_app.sizing_for(k8s_render.RenderOptions(), application)


# ------------------------------------------------------------------------------------------
# Design properties


# ------------------------------------------------------------------------------------------
# Engine pods: shared memory and the weights cache


ENGINE_GROUPS = ("grrm-gpus", "policy-gpus")


def mounts(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's volumes by the path its container mounts them at."""
    volumes = {volume["name"]: volume for volume in template["spec"].get("volumes", [])}
    container = template["spec"]["containers"][0]
    return {mount["mountPath"]: volumes[mount["name"]] for mount in container.get("volumeMounts", [])}


def quantity_gi(text: str) -> int:
    assert text.endswith("Gi"), text
    return int(text[:-2])


@pytest.mark.parametrize(("tp", "per_worker"), [(1, 1), (2, 1), (4, 2), (8, 1)])
def test_every_engine_pod_has_a_memory_backed_dev_shm_sized_for_its_ranks(tp, per_worker, crd_validators) -> None:
    from cluster.engines.memory import GIB, shared_memory_bytes

    files = rendered(tensor_parallel_size=tp, replicas_per_worker=per_worker, min_replicas=1, max_replicas=4)
    validate_all(files, crd_validators)
    rayservice = one(files, "rayservice-grrm.yaml")
    templates = pod_templates(rayservice)
    for group in ENGINE_GROUPS:
        shm = mounts(templates[group]).get("/dev/shm")
        assert shm is not None and shm["emptyDir"]["medium"] == "Memory", group  # a container's own is 64 MB
    reward = templates["grrm-gpus"]
    size = quantity_gi(mounts(reward)["/dev/shm"]["emptyDir"]["sizeLimit"])
    # What the pre-flight asks of a node for these ranks (vLLM's queues, NCCL), for every replica of the pod.
    assert size * GIB >= shared_memory_bytes(tp) * per_worker and size >= 1
    # It counts against the pod's memory: the pod asks for it on top of its share per GPU.
    memory = quantity_gi(reward["spec"]["containers"][0]["resources"]["limits"]["memory"])
    assert memory >= 16 + 32 * tp * per_worker + size
    policy_shm = quantity_gi(mounts(templates["policy-gpus"])["/dev/shm"]["emptyDir"]["sizeLimit"])
    assert policy_shm == 2 * 8
    # CPU-only pods run no engine.
    assert "/dev/shm" not in mounts(templates["grrm-services"]) and "/dev/shm" not in mounts(templates["head"])


def env_of(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in template["spec"]["containers"][0].get("env", [])}


def test_weights_come_from_a_cache_that_outlives_pods_filled_once_by_a_job(committed: dict[str, str]) -> None:
    rayservice = one(committed, "rayservice-grrm.yaml")
    templates = pod_templates(rayservice)
    for group in ENGINE_GROUPS:
        cache = mounts(templates[group])["/models"]
        assert cache["persistentVolumeClaim"] == {"claimName": "grrm-model-cache"}, group
        env = env_of(templates[group])
        assert env["HF_HOME"]["value"] == "/models/hf"
        # On by default: a pod starts from the cache without asking the hub.
        assert env["HF_HUB_OFFLINE"]["value"] == "1"
        # vLLM's compile cache on the shared volume: a new pod reuses what the first one compiled.
        assert env["VLLM_CACHE_ROOT"]["value"] == "/models/vllm-cache"
    claim, job = yaml_documents(committed)["model-cache.yaml"]
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == "grrm-model-cache"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # reward and trainer pods on many nodes read it
    # A storage class is a required choice: the committed file holds the placeholder envsubst fills.
    assert claim["spec"]["storageClassName"] == "${GRRM_RWX_STORAGE_CLASS}"
    assert "envsubst '$GRRM_RWX_STORAGE_CLASS' < k8s/model-cache.yaml" in committed["model-cache.yaml"]
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    model = yaml.safe_load(GRRM_YAML.read_text())["applications"][0]["args"]["engine"]["model"]
    assert container["command"][-1].endswith(f"&& hf download {model} && hf download Qwen/Qwen2.5-7B-Instruct")
    assert container["image"] == k8s_render.RenderOptions().image
    assert mounts(pod)["/models"]["persistentVolumeClaim"]["claimName"] == "grrm-model-cache"
    env = env_of(pod)
    assert env["HF_HOME"]["value"] == "/models/hf" and "HF_HUB_OFFLINE" not in env  # the Job alone asks the hub


def test_every_pod_that_mounts_the_cache_can_write_it(committed: dict[str, str]) -> None:
    """fsGroup 100 (the image's group users) and a root init container that makes the cache's directories
    group-writable, on the download Job and every engine pod."""
    templates = pod_templates(one(committed, "rayservice-grrm.yaml"))
    job = yaml_documents(committed)["model-cache.yaml"][1]["spec"]["template"]
    pods = {"download Job": job, **{group: templates[group] for group in ENGINE_GROUPS}}
    for name, pod in pods.items():
        spec = pod["spec"]
        assert spec["securityContext"] == {"fsGroup": 100, "fsGroupChangePolicy": "OnRootMismatch"}, name
        (init,) = spec["initContainers"]
        assert init["securityContext"]["runAsUser"] == 0, name
        assert init["volumeMounts"] == [{"name": "model-cache", "mountPath": "/models"}], name
        # Its own image: nothing more to pull.
        assert init["image"] == spec["containers"][0]["image"], name
    # CPU-only pods mount no cache and need none of it.
    assert "securityContext" not in templates["head"]["spec"] and "initContainers" not in templates["head"]["spec"]
    # Off where Pod Security forbids root containers; an emptyDir is writable by all anyway.
    for overrides in ({"model_cache_fix_permissions": False}, {"model_cache_pvc": None, "hf_offline": False}):
        reward = pod_templates(one(rendered(**overrides), "rayservice-grrm.yaml"))["grrm-gpus"]["spec"]
        assert "initContainers" not in reward and reward["securityContext"]["fsGroup"] == 100


def _run_pod_script(command: list[str], cache: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """A container's bash command run here, its /models moved to ``cache`` and `hf` a stub that logs."""
    stub = tmp_path / "bin" / "hf"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/hf.log\n')
    stub.chmod(0o755)
    script = command[-1].replace("/models", str(cache))
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)


def test_the_cache_scripts_prepare_the_volume_and_the_job_stops_on_one_it_cannot_write(
    committed: dict[str, str], tmp_path: Path
) -> None:
    job = yaml_documents(committed)["model-cache.yaml"][1]["spec"]["template"]["spec"]
    (init,) = job["initContainers"]
    cache = tmp_path / "volume"
    cache.mkdir()
    prepared = _run_pod_script(init["command"], cache, tmp_path)
    assert prepared.returncode == 0  # never blocks the pod: the Job's own check speaks
    for directory in (cache, cache / "hf", cache / "vllm-cache"):
        assert directory.is_dir()
        if not prepared.stdout:  # root here: group users, group-writable, new files inherit the group
            assert directory.stat().st_gid == 100 and directory.stat().st_mode & 0o2070 == 0o2070
    download = _run_pod_script(job["containers"][0]["command"], cache, tmp_path)
    assert download.returncode == 0, download.stderr
    assert (tmp_path / "hf.log").read_text().split("\n")[:2] == [
        f"download {yaml.safe_load(GRRM_YAML.read_text())['applications'][0]['args']['engine']['model']}",
        "download Qwen/Qwen2.5-7B-Instruct",
    ]
    # A volume the image's user cannot write (an NFS export squashing root): stop at once, name the fix.
    refused = _run_pod_script(job["containers"][0]["command"], tmp_path / "missing", tmp_path)
    assert refused.returncode == 1
    assert "not writable" in refused.stderr and "k8s/README.md, Weights" in refused.stderr


def test_offline_is_the_default_and_other_caches_render(crd_validators) -> None:
    files = rendered(hf_offline=False)
    validate_all(files, crd_validators)
    for group in ENGINE_GROUPS:
        assert "HF_HUB_OFFLINE" not in env_of(pod_templates(one(files, "rayservice-grrm.yaml"))[group]), group
    # A node path instead of a PVC: no claim, no Job; filled by you (offline) or each node's first pod.
    files = rendered(model_cache_pvc=None, model_cache_host_path="/var/lib/grrm/hf")
    validate_all(files, crd_validators)
    assert "model-cache.yaml" not in files
    reward = pod_templates(one(files, "rayservice-grrm.yaml"))["grrm-gpus"]
    assert mounts(reward)["/models"]["hostPath"]["path"] == "/var/lib/grrm/hf"
    assert reward["spec"]["initContainers"][0]["name"] == "cache-permissions"  # kubelet creates it root-owned
    # Neither: a cache that dies with its pod (every new pod downloads, so it must ask the hub).
    files = rendered(model_cache_pvc=None, hf_offline=False)
    assert "emptyDir" in mounts(pod_templates(one(files, "rayservice-grrm.yaml"))["grrm-gpus"])["/models"]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"model_cache_host_path": "/var/lib/hf"}, "choose one cache"),
    ({"model_cache_pvc": None}, "hf_offline .*--no-hf-offline"),
    ({"model_cache_storage_class": None}, "model_cache_storage_class: .*ReadWriteMany.*standard-rwx.*azurefile-csi.*EFS"),
    ({"model_cache_storage_class": "Not A Class"}, "model_cache_storage_class: 'Not A Class'"),
])
def test_cache_options_that_cannot_work_are_refused(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        rendered(**overrides)


def test_a_named_storage_class_is_written_and_needs_no_envsubst() -> None:
    files = rendered(model_cache_storage_class="standard-rwx")
    claim = yaml_documents(files)["model-cache.yaml"][0]
    assert claim["spec"]["storageClassName"] == "standard-rwx"
    assert "envsubst" not in files["model-cache.yaml"] and "kubectl apply -f k8s/model-cache.yaml" in files["model-cache.yaml"]


def test_cli_takes_the_cache_options(tmp_path: Path) -> None:
    argv = ["--model-cache-pvc", "", "--model-cache-host-path", "/mnt/hf", "--hf-offline", "--out", str(tmp_path)]
    assert k8s_render.main(argv) == 0
    reward = pod_templates(one({p.name: p.read_text() for p in tmp_path.iterdir()}, "rayservice-grrm.yaml"))["grrm-gpus"]
    assert mounts(reward)["/models"]["hostPath"]["path"] == "/mnt/hf"
    assert not (tmp_path / "model-cache.yaml").exists()
    # A render without a storage class fails naming the option (exit 2, no stack trace).
    assert k8s_render.main(["--model-cache-storage-class", "", "--out", str(tmp_path / "x")]) == 2


def test_head_takes_no_work_and_no_traffic(committed: dict[str, str]) -> None:
    rayservice = one(committed, "rayservice-grrm.yaml")
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["rayStartParams"]["num-gpus"] == "0"
    container = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert rayservice["spec"]["excludeHeadPodFromServeSvc"] is True
    # Scale to zero: the head's proxy is the only one left to receive the request that scales up.
    assert one(rendered(min_replicas=0), "rayservice-grrm.yaml")["spec"]["excludeHeadPodFromServeSvc"] is False


def test_autoscaling_and_probes(committed: dict[str, str]) -> None:
    rayservice = one(committed, "rayservice-grrm.yaml")
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["version"] == "v2"
    # Every demand fits one group only (test_every_ray_demand_fits_exactly_the_group_meant_for_it): no
    # group needs the autoscaler's `priority` to win a choice.
    assert not any("priority" in group for group in cluster["workerGroupSpecs"])
    for name, template in pod_templates(rayservice).items():
        container = template["spec"]["containers"][0]
        assert container["livenessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}, name
        assert container["resources"]["requests"] == container["resources"]["limits"], name
        if name != "head":
            assert container["readinessProbe"]["httpGet"] == {"path": "/-/healthz", "port": 8000}, name
        if name not in ("head", "grrm-services"):  # the CPU-only pods need no GPU toleration
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in template["spec"][
                "tolerations"
            ]


def test_secrets_are_referenced_by_name_and_key(committed: dict[str, str]) -> None:
    secrets = {
        doc["metadata"]["name"]: doc
        for docs in yaml_documents(committed).values()
        for doc in docs
        if doc["kind"] == "Secret"
    }
    assert set(secrets) == {"hf-token", "grrm-api-token", "grrm-redis"}
    rayservice = one(committed, "rayservice-grrm.yaml")
    seen: dict[str, set[str]] = {}
    for name, template in pod_templates(rayservice).items():
        for env in template["spec"]["containers"][0].get("env", []):
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                assert ref["name"] in secrets, ref
                assert ref["key"] in secrets[ref["name"]]["stringData"], ref
                seen.setdefault(env["name"], set()).add(name)
    assert seen["HF_TOKEN"] == seen["HUGGING_FACE_HUB_TOKEN"] == {"grrm-gpus", "policy-gpus"}
    # The ingress runs on the grrm-services pods, never on the head: the token goes to the workers.
    assert "grrm-services" in seen["GRRM_API_TOKEN"] and "head" not in seen["GRRM_API_TOKEN"]


def test_metrics_service_and_scrape_config_cover_every_ray_pod(committed: dict[str, str]) -> None:
    rayservice = one(committed, "rayservice-grrm.yaml")
    service = one(committed, "metrics-service.yaml")
    selector = dict(service["spec"]["selector"])
    assert "ray.io/cluster" not in selector  # survives cluster renames
    assert "app.kubernetes.io/name" not in selector  # KubeRay owns that label on its pods
    # The renderer's labels and KubeRay's on every Ray pod (a label the template does not carry: KubeRay adds it).
    assert selector.pop("ray.io/is-ray-node") == "yes"
    for name, template in pod_templates(rayservice).items():
        assert selector.items() <= template["metadata"]["labels"].items(), name
    # The other pods of the deployment export no metrics, and carry no ray.io label to be selected by.
    others = [yaml_documents(committed)["redis.yaml"][1], yaml_documents(committed)["model-cache.yaml"][1],
              {"spec": {"template": one(committed, "verl-job.yaml")["spec"]["submitterPodTemplate"]}}]
    for other in others:
        assert not any(key.startswith("ray.io/") for key in other["spec"]["template"]["metadata"]["labels"])
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert ports["metrics"] == 8080, name
    cluster = rayservice["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["rayStartParams"]["metrics-export-port"] == "8080"
    configmap = one(committed, "prometheus-scrape-config.yaml")
    (job,) = yaml.safe_load(configmap["data"]["grrm-ray-scrape.yml"])["scrape_configs"]
    rules = job["relabel_configs"]
    keeps = {tuple(rule["source_labels"]): rule["regex"] for rule in rules if rule.get("action") == "keep"}
    assert keeps[("__meta_kubernetes_service_name",)] == service["metadata"]["name"]
    assert keeps[("__meta_kubernetes_endpoint_port_name",)] == service["spec"]["ports"][0]["name"] == "metrics"
    assert job["kubernetes_sd_configs"][0]["namespaces"]["names"] == [service["metadata"]["namespace"]]


# ------------------------------------------------------------------------------------------
# The verl job on the same Ray cluster


def _verl_config() -> dict[str, Any] | None:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return yaml.load(path.read_text(), Loader=_Loader) if path.is_file() else None


def test_verl_job_targets_the_service_cluster_and_the_bridge(committed: dict[str, str]) -> None:
    job = one(committed, "verl-job.yaml")
    spec = job["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": "${GRRM_RAY_CLUSTER}"}
    assert spec["shutdownAfterJobFinishes"] is False
    assert "rayClusterSpec" not in spec
    entrypoint = spec["entrypoint"]
    for override in (
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.module.path=pkg://trainer_bridge.reward_manager",
        "reward.reward_manager.name=GRRMRewardManager",
        "+reward.reward_kwargs.app_name=grrm",
        "+reward.reward_kwargs.replica_deployment=GRRMReplica",
        "trainer.n_gpus_per_node=8",
    ):
        assert override in entrypoint.split(), override
    assert entrypoint.split()[:3] == ["python3", "-m", "verl.trainer.main_ppo"]

    # The driver is placed on a trainer node: only the policy group advertises that resource.
    rayservice = one(committed, "rayservice-grrm.yaml")
    wanted = json.loads(spec["entrypointResources"])
    policy = ray_custom_resources(worker_group(rayservice, "policy-gpus")["rayStartParams"])
    reward = ray_custom_resources(worker_group(rayservice, "grrm-gpus")["rayStartParams"])
    assert all(policy.get(key, 0) >= amount for key, amount in wanted.items())
    assert not set(wanted) & set(reward)
    policy_gpus = worker_group(rayservice, "policy-gpus")["rayStartParams"]["num-gpus"]
    assert f"trainer.n_gpus_per_node={policy_gpus}" in entrypoint.split()


def test_verl_overrides_exist_in_verls_config() -> None:
    """Plain overrides name existing keys of verl's ppo_trainer config; `+` overrides add new ones."""
    config = _verl_config()
    if config is None:
        pytest.skip("verl is not installed")
    sizing = k8s_app.sizing_for(
        k8s_render.RenderOptions(), k8s_app.grrm_application(k8s_app.load_serve_config())
    )
    for override in verl_job.verl_overrides(k8s_render.RenderOptions(), sizing):
        key = override.split("=", 1)[0]
        node: Any = config
        exists = True
        for part in key.lstrip("+").split("."):
            if not (isinstance(node, dict) and part in node):
                exists = False
                break
            node = node[part]
        if key.startswith("+"):
            assert not exists, f"{key}: exists in verl's config, drop the '+' (Hydra refuses to add it)"
        else:
            assert exists, f"{key}: not a key of verl's ppo_trainer config (Hydra refuses to override it)"


def test_reward_manager_module_is_the_bridge() -> None:
    sizing = k8s_app.sizing_for(k8s_render.RenderOptions(), k8s_app.grrm_application(k8s_app.load_serve_config()))
    overrides = dict(override.split("=", 1) for override in verl_job.verl_overrides(k8s_render.RenderOptions(), sizing))
    module = overrides["reward.reward_manager.module.path"].removeprefix("pkg://")
    # What verl does with the path (verl.utils.import_utils.load_extern_object): import, then getattr.
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

    manager = getattr(importlib.import_module(module), overrides["reward.reward_manager.name"])
    assert issubclass(manager, RewardManagerBase) and manager.__module__ == "grrm_client.adapters.verl.reward_manager"
    assert overrides["+reward.reward_kwargs.app_name"] == sizing.app_name


def test_verl_job_values_name_render_options(tmp_path: Path) -> None:
    sizing = k8s_app.sizing_for(k8s_render.RenderOptions(), k8s_app.grrm_application(k8s_app.load_serve_config()))
    path = tmp_path / "verl_job.yaml"
    path.write_text("a.b: '{rollout_n}'\nc: [x, true]\nd: 1e-6\ne: '{no_such_option}'\n")
    with pytest.raises(ValueError, match="no_such_option"):
        verl_job.verl_overrides(k8s_render.RenderOptions(rollout_n=4), sizing, path)
    path.write_text("a.b: '{rollout_n}'\nc: [x, true]\nd: 1e-6\n")
    assert verl_job.verl_overrides(k8s_render.RenderOptions(rollout_n=4), sizing, path) == ["a.b=4", "c=[x,true]", "d=1e-6"]


def test_submit_script_runs_the_same_job(committed: dict[str, str]) -> None:
    script = K8S_DIR / "submit-verl-job.sh"
    assert script.stat().st_mode & 0o111, "submit-verl-job.sh is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)
    job_entrypoint = one(committed, "verl-job.yaml")["spec"]["entrypoint"]
    text = committed["submit-verl-job.sh"]
    assert text.rstrip().endswith(job_entrypoint.rstrip().splitlines()[-1].strip())
    assert "-- " + job_entrypoint.splitlines()[0] in text
    assert "grrm-head-svc.grrm.svc.cluster.local:8265" in text
    assert "--entrypoint-resources '{\"verl_trainer\": 1}'" in text


def test_readme_patches_name_the_groups_they_mean(committed: dict[str, str]) -> None:
    """The README's `kubectl patch` lines index workerGroupSpecs; each says which group it means."""
    groups = [group["groupName"] for group in
              one(committed, "rayservice-grrm.yaml")["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
    patches = re.findall(r'workerGroupSpecs/(\d+)/\w+".*#\s*([a-z-]+)', (K8S_DIR / "README.md").read_text())
    assert len(patches) == 2
    for index, group in patches:
        assert groups[int(index)] == group

"""KubeRay manifests for the reward cluster (rendered by :mod:`k8s.render`; not shipped in the wheel)."""

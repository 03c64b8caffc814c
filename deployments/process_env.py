"""Environment every process that reads request bodies starts with: Serve's HTTP proxies and the ingress.

glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), so after the
first refused upload the body chunks (1 MiB each) come from the heap and are never given back: 30
refused 60 MB uploads left Serve's proxy and the ingress 360 MiB larger. At a fixed 128 KiB threshold a
chunk is mapped and unmapped on its own, and the same uploads left 143 MiB (bench/hostile_tenants.py,
refusals). glibc reads it when a process starts: it is set where the processes are started (the
ingress's runtime environment; `grrm serve`'s `serve run`; the Kubernetes pods of the serving workers).
"""

from __future__ import annotations

__all__ = ["BODY_MEMORY_ENV"]

BODY_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}

"""The Grafana dashboard (deployments/grafana/grrm.json) queries only metrics the service exports,
under the names Prometheus scrapes them by, and shows every metric the scorer replicas define.

The exported names are collected from the metric definitions themselves (the project's and the
installed Ray Serve's), not from a copy of the panel list: Ray prefixes every metric with ``ray_``,
a counter is scraped as ``<name>_total`` and a histogram as ``<name>_bucket``/``_sum``/``_count``."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import ray.serve

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deployments" / "grafana" / "grrm.json"
KINDS = ("Counter", "Gauge", "Histogram")


def defined_metrics(folder: Path) -> dict[str, str]:
    """Every ``Counter("name", ...)``, ``Gauge(...)``, ``Histogram(...)`` under folder: name -> kind."""
    found = {}
    for path in folder.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            kind = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if kind not in KINDS:
                continue
            names = [arg for arg in node.args[:1]] + [kw.value for kw in node.keywords if kw.arg == "name"]
            for name in names:
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    found[name.value] = kind
    return found


def scraped_names(name: str, kind: str) -> set[str]:
    base = f"ray_{name}"
    if kind == "Counter":
        return {base if base.endswith("_total") else f"{base}_total"}
    if kind == "Histogram":
        return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    return {base}


def exported(definitions: dict[str, str]) -> set[str]:
    return set().union(*(scraped_names(name, kind) for name, kind in definitions.items()))


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    queries += [variable["definition"] for variable in board["templating"]["list"] if "definition" in variable]
    return queries


def queried_metrics(query: str) -> set[str]:
    # Metric names are the ray_* identifiers; PromQL functions and labels are not prefixed.
    return set(re.findall(r"\bray_[a-z0-9_]+\b", query))


PROJECT = {**defined_metrics(ROOT / "deployments"), **defined_metrics(ROOT / "cluster")}
SERVE = defined_metrics(Path(ray.serve.__file__).parent)


def test_the_definitions_were_found():
    # Guards the collector itself: a miss would make every later check vacuous.
    assert PROJECT["grrm_groups_scored"] == "Counter" and PROJECT["grrm_stage_latency_s"] == "Histogram"
    assert SERVE["serve_deployment_replica_healthy"] == "Gauge"
    assert "ray_grrm_groups_scored_total" in exported(PROJECT)


def test_every_query_names_a_metric_the_service_exports():
    known = exported(PROJECT) | exported(SERVE)
    queries = dashboard_queries()
    assert len(queries) >= 20
    unknown = {}
    for query in queries:
        names = queried_metrics(query)
        assert names, f"a query without a metric: {query}"
        for name in names - known:
            unknown[name] = query
    assert not unknown, f"metrics no definition exports (as scraped): {unknown}"


def test_every_metric_of_the_replicas_is_on_the_dashboard():
    used = set().union(*(queried_metrics(query) for query in dashboard_queries()))
    missing = [name for name, kind in PROJECT.items() if name.startswith("grrm_")
               and not scraped_names(name, kind) & used]
    assert not missing, f"metrics the replicas export that no panel shows: {missing}"


def test_the_checks_reject_a_name_as_written_in_code():
    # The names as written in the code (no ray_ prefix, no _total) are not what Prometheus holds.
    known = exported(PROJECT) | exported(SERVE)
    assert "grrm_groups_scored" not in known and "ray_grrm_groups_scored" not in known
    assert "ray_grrm_stage_latency_s" not in known and "ray_grrm_stage_latency_s_bucket" in known

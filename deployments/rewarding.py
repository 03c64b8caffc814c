"""The recipe's edge in a scorer replica: what :class:`~cluster.recipe_runner.RecipeRunner` is given there.

A replica runs every group through its tenant's recipe (``tenants.default.recipe``, ``http.tenants[i].recipe``;
docs/recipes.md). This module gives the runner what a process has to build: the language gate over lingua
(built once, off the event loop, and only where a recipe has a language part: ~230 MB and ~2 s of CPU),
the clients of the metric model deployments the recipes' model parts name, and worker threads for the
gate and the costly rule parts (BLEU, chrF), so that a group's rule parts never hold the event loop
the replica's members wait on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from cluster.recipe import MetricModel
from cluster.recipe_runner import Passes, RecipeRunner
from deployments.config import AppConfig

__all__ = ["recipe_runner"]


async def recipe_runner(config: AppConfig, replica: str, metric_handles: Mapping[str, Any] | None = None,
                        metric_models: Mapping[str, MetricModel] | None = None,
                        passes: Passes | None = None) -> RecipeRunner:
    """The recipe runner of a replica of ``config`` (``replica``: its name in answers).

    ``metric_handles``: the metric model deployments' handles as Serve binds them (``deployments/app.py``);
    ``metric_models`` and ``passes`` replace the clients and the lingua gate (tests, benches). A recipe
    this replica cannot apply is refused here, naming its field.
    """
    recipes = config.recipes()
    if passes is None and any(recipe.language is not None for _, recipe in recipes):
        from cluster.language_gate import LanguageGate
        from deployments.language_detection import lingua_detector

        passes = LanguageGate(await asyncio.to_thread(lingua_detector)).passes
    if metric_models is None:
        metric_models = {}
        if any(recipe.model_parts() for _, recipe in recipes):
            from deployments.metric_models import metric_model_clients

            metric_models = metric_model_clients(config, metric_handles)
    runner = RecipeRunner(lambda tenant: config.tenant(tenant).recipe, passes=passes, metric_models=metric_models,
                          off_loop=asyncio.to_thread, replica=replica)
    for where, recipe in recipes:
        runner.check(where, recipe)
    return runner

"""Where ``grrm score`` scores a group: a running service (HTTP or a Serve handle) or an engine here.

The service is reached through :class:`grrm_client.RewardClient`
(bounded attempts with exponential backoff on 503 / back pressure / a lost replica, Retry-After
honoured, a deadline per group, the bearer token from the environment). In-process scoring runs
the config file's engine under :class:`~cluster.scorer.GroupScorer` and the tenant's reward recipe
(``cluster/recipe_runner.py``), as a replica would, without Ray (and so without the recipe's model
parts, which are deployments of their own).

Every scorer answers a group with its result columns (:func:`grrm_cli.columns.result_fields`),
a flagged failure included, or raises :class:`ScoringStopped` when there is no answer to write
(the service cannot be reached, the engine died): the run then stops, and a rerun sends those
groups again rather than writing them as failed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import httpx

from cluster.failures import kind_of
from cluster.protocol.schema import GroupRequest
from grrm_cli.columns import result_fields
from grrm_client import RewardClient
from grrm_client.config import ClientConfig



def refused_for_its_own_content(failure: str | None) -> bool:
    """Whether a call that got no answer was refused for the group's own content (over a limit,
    invalid): written as the row's failure. Anything else (the service unreachable, 401 after a
    token change, 404 after the application went away) would fail every row alike: the run stops."""
    kind = kind_of(failure)
    return kind is not None and kind.bad_input


class SetupError(RuntimeError):
    """Scoring cannot start as asked (unreachable URL, wrong token, no such application)."""


class ScoringStopped(RuntimeError):
    """No answer can be had for a group (service unreachable after retries, dead engine)."""


class GroupScoring(Protocol):
    """One way of scoring groups."""

    async def start(self) -> str:
        """Get ready; returns what scores (for the summary)."""
        ...

    async def score(self, group: GroupRequest) -> dict[str, Any]:
        """The result columns of one group; raises ScoringStopped when there is no answer."""
        ...

    async def announce(self, groups: int, lasts_s: float) -> bool:
        """Announce ``groups`` coming over ``lasts_s`` to the autoscaling (0: withdraw); whether it was taken."""
        ...

    async def close(self) -> None:
        """Release what start acquired."""
        ...


class ServiceScoring:
    """A running GRRM service, over HTTP (``--url``) or through a Serve handle (``--app``)."""

    def __init__(self, config: ClientConfig, ray_address: str | None = None):
        self.config = config
        self.ray_address = ray_address
        self.client = RewardClient(config)

    async def start(self) -> str:
        if self.config.transport == "http":
            return self._check_http()
        connect_app(self.config.app_name, self.ray_address)
        return f"Serve application {self.config.app_name!r} (handle to {self.config.replica_deployment})"

    def _check_http(self) -> str:
        """One GET /v1/info before the first group: a wrong URL or token is one clear error, not N failed rows."""
        info = service_info(self.config)
        model = f", model {info['model']}" if info.get("model") else ""
        return f"{info.get('engine')} engine{model}, at {self.config.http_url.rstrip('/')}"

    async def score(self, group: GroupRequest) -> dict[str, Any]:
        outcome = await self.client.score_group(group)
        if outcome.result is None and not refused_for_its_own_content(outcome.failure):
            raise ScoringStopped(f"{outcome.failure} after {outcome.attempts} attempts: {outcome.error}")
        return result_fields(outcome.result, outcome.failure, outcome.error)

    async def announce(self, groups: int, lasts_s: float) -> bool:
        return await self.client.announce_demand(groups=groups, lasts_s=lasts_s)

    async def close(self) -> None:
        await self.client.aclose()


class InProcessScoring:
    """The engine and scoring settings of a Serve config file's application, in this process (no Ray)."""

    def __init__(self, config_path: Path):
        self.config_path = config_path
        self.engine: Any = None
        self.scorer: Any = None
        self.rewards: Any = None  # the config's recipes (cluster/recipe_runner.py)

    async def start(self) -> str:
        from cluster.engines import make_engine
        from cluster.scorer import GroupScorer
        from deployments.app import resolve_model_path
        from deployments.config import load_app_config
        from deployments.rewarding import recipe_runner

        try:
            config = resolve_model_path(load_app_config(self.config_path))
            # No metric model deployments here: a recipe with a model part is refused, naming it.
            self.rewards = await recipe_runner(config, "in-process", metric_models={})
        except (OSError, ValueError) as error:
            raise SetupError(f"--config {self.config_path}: {error}") from None
        # The replicas' environment (e.g. vLLM's CPU switches) applies here too, where not set.
        for name, value in config.replicas.env_vars.items():
            os.environ.setdefault(name, value)
        if config.build_tiny_model_if_missing:
            from cluster.tiny_model import ensure_tiny_model

            ensure_tiny_model(config.engine.model)
        if config.engine.kind != "scripted":
            from cluster.engines.model_source import ModelNotFoundError, resolve_model

            try:  # before the engine's start, which fails minutes in on a model it cannot find
                resolve_model(config.engine.model)
            except ModelNotFoundError as error:
                raise SetupError(f"--config {self.config_path}: {error}") from None
        self.engine = make_engine(config.engine)
        await self.engine.start()
        self.scorer = GroupScorer(self.engine, config.scoring, replica="in-process")
        model = f", model {config.engine.model}" if config.engine.model else ""
        return f"{config.engine.kind} engine{model}, in this process"

    async def score(self, group: GroupRequest) -> dict[str, Any]:
        try:
            result = (await self.rewards.run(group, self.scorer)).group_result(group)
        except Exception as error:  # noqa: BLE001 - the scorer flags engine trouble; what escapes is fatal
            raise ScoringStopped(f"the engine failed: {type(error).__name__}: {error}") from error
        return result_fields(result)

    async def announce(self, groups: int, lasts_s: float) -> bool:
        return False  # one engine in this process: no pool to scale

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.stop()


def service_info(config: ClientConfig) -> dict[str, Any]:
    """The service's ``GET /v1/info`` (over ``config.http_url``, with its token); a SetupError that says
    what to fix when the URL or the token is wrong."""
    url = config.http_url.rstrip("/")
    token = os.environ.get(config.token_env, "") if config.token_env else ""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{url}/v1/info", headers=headers, timeout=30)
    except httpx.HTTPError as error:
        raise SetupError(f"--url: cannot reach {url} ({type(error).__name__}: {error})") from None
    if response.status_code == 401:
        raise SetupError(
            f"--url: {url} wants a bearer token: set {config.token_env} to the service's token"
            if not token else f"--url: {url} refused the token in {config.token_env} (401)"
        )
    if response.status_code != 200:
        raise SetupError(
            f"--url: GET {url}/v1/info answered {response.status_code}; give the application's base URL "
            "(its route prefix included), e.g. http://127.0.0.1:8000"
        )
    return response.json()


def connect_app(app_name: str, address: str | None, flag: str = "--app") -> None:
    """Join the Ray cluster (:func:`connect_ray`) and make sure it runs Serve application ``app_name``;
    a SetupError naming ``flag`` and the applications there when it does not."""
    connect_ray(address)
    from ray import serve

    applications = serve.status().applications
    if app_name not in applications:
        raise SetupError(f"{flag}: no Serve application {app_name!r} on this Ray cluster "
                         f"(applications: {', '.join(applications) or 'none'})")


def connect_ray(address: str | None) -> None:
    """Join the Ray cluster (``address``, else ``RAY_ADDRESS``, else the local one) unless already in one."""
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address or "auto", log_to_driver=False, configure_logging=False)
    except ConnectionError as error:
        raise SetupError(f"no Ray cluster to join at {address or 'auto'} ({error}); start one or pass --address") from None

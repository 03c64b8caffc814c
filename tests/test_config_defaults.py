"""Each setting's default is declared once: the core dataclass or model owns it, the edge models and the
command line derive theirs from it.

The test walks the config tree (the app config and every model nested in it, the client's and the trainer
adapters' configs, the core dataclasses they derive from, their bases) and the options of the CLI's parsers,
reads each field's and option's default from the source, and fails where one setting has a default *literal*
in two places: two literals drift apart (autoscaling's cold start once said 30 s in the core, 60 s at the
edge). A default taken from another declaration (``Field(_CORE.cold_start_s)``, ``default=ClientConfig...``)
is no literal. A setting is known by its name; the few names that stand for different settings in different
places are listed in ``DISTINCT``, each with why.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel

from cluster.autoscaling import ScalingSettings
from cluster.engines.base import SamplingSettings
from cluster.fair_share import TenantPolicy
from cluster.planning.profiling import ProfileSettings
from cluster.protocol.openrlhf import OpenRLHFSettings
from cluster.protocol.retry import RetryPolicy
from cluster.rewards import RewardSettings
from deployments.config import AppConfig
from grrm_client.adapters.config import AdapterConfig
from grrm_client.adapters.slime import SlimeRewardConfig
from grrm_client.adapters.trl import TRLRewardConfig
from grrm_client.adapters.verl.config import BridgeConfig
from grrm_client.config import ClientConfig
from grrm_client.demand import DemandSettings

ROOT = Path(__file__).resolve().parents[1]

# The config tree's roots: the app config (everything nested in it is walked), the client and its adapters,
# and the core dataclasses the edge models derive from.
CONFIGS = (AppConfig, ClientConfig, AdapterConfig, BridgeConfig, TRLRewardConfig, SlimeRewardConfig,
           OpenRLHFSettings, DemandSettings, ProfileSettings,
           ScalingSettings, RetryPolicy, RewardSettings, TenantPolicy, SamplingSettings)
# The command lines whose options may re-declare a config default.
PARSERS = (*sorted((ROOT / "grrm_cli").glob("*.py")), ROOT / "cpu_harness" / "trl_run.py")
PACKAGES = ("cluster", "deployments", "grrm_client", "grrm_cli", "trainer_bridge")

# Names that stand for different settings in different places: the places, and why they are not one setting.
DISTINCT: dict[str, tuple[frozenset[str], str]] = {
    "kind": (frozenset({"GrrmPart", "ModelPart", "ChrfPart", "LanguagePart", "BleuPart", "LengthRatioPart",
                        "FormatPart", "OverlongPart", "EngineConfig"}),
             "each recipe part's discriminator, and the engine's: what a thing is, not one setting"),
    "seed": (frozenset({"ScoringConfig", "EngineConfig", "ScriptedEngineOptions", "grrm_cli/evaluate.py --seed"}),
             "the attempts' base seed, the engine's own, the scripted engine's draws and the bootstrap's: four "
             "generators"),
    "weight": (frozenset({"Part", "TenantPolicy"}),
               "a recipe part's weight in a reward, a tenant's share of an engine"),
    "num_cpus": (frozenset({"ServiceSettings", "ReplicaSettings"}),
                 "the CPUs of the ingress and ledger replicas, and of a scorer replica: different deployments"),
    "wake_s": (frozenset({"ScriptedEngineOptions", "ScalingSettings"}),
               "how long the scripted engine takes to wake (a test engine's behaviour), and how long the "
               "autoscaling policy plans a wake-up to take"),
    "max_replicas": (frozenset({"ScalingSettings", "grrm_cli/plan.py --max-replicas"}),
                     "the pool's bound, and the largest pool grrm plan tries"),
}


def _literal(node: ast.expr | None) -> object:
    """The literal a default expression writes (``Field(<literal>, ...)`` and ``field(default=...)`` too), or
    ``NotImplemented`` where it writes none (a name, an attribute, a call: taken from elsewhere). None is no
    default to keep in step (it means unset), so it counts as none."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("Field", "field"):
        default = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "default"), None)
        return _literal(default)
    try:
        value = ast.literal_eval(node) if node is not None else None
    except ValueError:
        return NotImplemented
    return NotImplemented if value is None else value


def _config_classes() -> set[type]:
    """Every class of the config tree: the roots, their project bases and the models or dataclasses their
    fields hold."""
    found: set[type] = set()

    def nested(annotation: object) -> list[type]:
        own = [annotation] if isinstance(annotation, type) else []
        return own + [cls for arg in typing.get_args(annotation) for cls in nested(arg)]

    def visit(cls: type) -> None:
        if cls in found or cls.__module__.split(".")[0] not in PACKAGES:
            return
        if not (issubclass(cls, BaseModel) or dataclasses.is_dataclass(cls)):
            return
        found.add(cls)
        for base in cls.__mro__[1:]:
            visit(base)
        hints = ([field.annotation for field in cls.model_fields.values()] if issubclass(cls, BaseModel)
                 else list(typing.get_type_hints(cls).values()))
        for annotation in hints:
            for inner in nested(annotation):
                visit(inner)

    for root in CONFIGS:
        visit(root)
    return found


def _declared_defaults() -> dict[str, list[tuple[str, object]]]:
    """Per setting name, each place that writes its default as a literal, with the literal."""
    places: dict[str, list[tuple[str, object]]] = defaultdict(list)
    for cls in _config_classes():
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        for statement in body.body:  # type: ignore[attr-defined]
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and "ClassVar" not in ast.unparse(statement.annotation)):  # a class's trait, not a field
                value = _literal(statement.value)
                if value is not NotImplemented:
                    places[statement.target.id].append((cls.__qualname__, value))
    for path in PARSERS:
        for call in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument"):
                continue
            default = next((k.value for k in call.keywords if k.arg == "default"), None)
            value = _literal(default)
            flags = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            dest = next((k.value.value for k in call.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)),
                        next((flag.lstrip("-") for flag in flags if flag.startswith("--")), flags[0] if flags else ""))
            if value is not NotImplemented and dest:
                places[dest.replace("-", "_")].append((f"{path.relative_to(ROOT)} {flags[-1]}", value))
    return places


def test_each_default_is_declared_once():
    twice = []
    for name, places in sorted(_declared_defaults().items()):
        owners = {owner for owner, _ in places}
        if len(places) < 2 or (name in DISTINCT and owners <= DISTINCT[name][0]):
            continue
        twice.append(f"{name}: " + ", ".join(f"{owner} = {value!r}" for owner, value in places))
    assert not twice, ("a setting's default is written in more than one place (declare it once, derive the "
                       "others from it):\n" + "\n".join(twice))


def test_the_walk_reaches_the_tree():
    """The walk sees the settings it guards: a nested app model, the core dataclasses and the CLI's options."""
    classes = {cls.__qualname__ for cls in _config_classes()}
    assert {"AutoscalingSettings", "ScalingSettings", "RetryPolicy", "ClientConfig", "BridgeConfig",
            "EngineConfig", "ScriptedEngineOptions", "TenantDefaults"} <= classes
    owners = {owner for places in _declared_defaults().values() for owner, _ in places}
    assert any(owner.startswith("grrm_cli/score.py --") for owner in owners)


def test_distinct_names_are_still_declared_where_listed():
    """An entry of DISTINCT whose places no longer declare the name is stale: remove it."""
    declared = _declared_defaults()
    for name, (owners, _why) in DISTINCT.items():
        assert len({owner for owner, _ in declared.get(name, [])}) >= 2, f"DISTINCT[{name!r}] is stale"

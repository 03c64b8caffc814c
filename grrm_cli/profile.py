"""``grrm profile``: measure a deployed engine and write its profile for ``grrm plan --profile``.

Sends GQM groups (a sample of your data, or made from a group size and lengths) through the client every
caller uses, at each concurrency keeping that many in flight, and writes the groups per second, the
tokens per second and the replicas' cold start as a profile (JSON, cluster/planning/profile.py's format
1). The cold start is what the replicas measured themselves (construction to serving, the largest of
those running), or --cold-start-s; Serve's scheduling of a new replica's actor (seconds) is not in the
replicas' own figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cluster.planning.profile import EngineProfile
from cluster.planning.profiling import (
    MadeGroups,
    ProfileSettings,
    Window,
    field_error,
    made_groups,
    measure,
    point_of,
    profile_of,
    sample_groups,
)
from cluster.protocol.schema import DEFAULT_TENANT, GroupRequest
from grrm_cli import columns as cols
from grrm_cli.client_options import CLIENT_DEFAULTS, add_retry_options, add_token_option
from grrm_cli.dataset import DatasetError, detect_format, read_rows
from grrm_cli.plan import print_table
from grrm_cli.score import add_column_options, column_mapping
from grrm_cli.scorers import SetupError, connect_app, service_info
from grrm_client import RewardClient
from grrm_client.config import ClientConfig

# A profile measures the engine: a group not answered within a third of a trainer's deadline is a failure to
# count (--max-failures), not one to wait for.
DEADLINE_S = CLIENT_DEFAULTS.deadline_s / 3
_PROFILE = ProfileSettings.model_fields

EXAMPLES = """\
examples:
  grrm profile --app-name grrm --group-size 8 --source-words 30 --candidate-words 35 --out profile.json
  grrm profile --url http://127.0.0.1:8000 --app-name grrm --sample data/demo_groups.jsonl --out profile.json
  grrm profile --url https://reward.example.org --cold-start-s 90 --sample groups.parquet --out profile.json
  grrm plan --profile profile.json --synthetic batch=64,n=8,gen_s=120,train_s=240,steps=6

The profile counts one replica's share of what the replicas serving scored together (grrm plan
divides by them): a pool of one replica measures it directly. A pool that changes size while it is
measured is reported; fix its size (num_replicas) to profile it.
"""
# Each option a field of the settings is checked as: a bad value's message names the option.
FLAGS = {"concurrency": "--concurrency", "groups_per_point": "--groups-per-point", "warmup_groups": "--warmup-groups",
         "max_failures": "--max-failures", "group_size": "--group-size", "source_words": "--source-words",
         "candidate_words": "--candidate-words", "tenant": "--tenant", "http_url": "--url", "app_name": "--app-name",
         "deadline_s": "--deadline-s", "max_attempts": "--max-attempts"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``grrm profile``."""
    parser = subparsers.add_parser(
        "profile", help="measure a deployed engine's throughput and cold start (a profile for grrm plan)",
        description=__doc__.split("\n\n")[1], epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_argument_group("the service (--url, --app-name or both)")
    where.add_argument("--url", help="send over HTTP to this base URL (its route prefix included)")
    where.add_argument("--app-name", metavar="NAME",
                       help="the Serve application on the Ray cluster: sent to through its handle without --url; "
                            "its replicas' own cold starts are read either way (needs the Ray cluster)")
    where.add_argument("--address", help="Ray cluster to join for --app-name (default: RAY_ADDRESS or the local one)")
    where.add_argument("--tenant", default=DEFAULT_TENANT, metavar="NAME", help="who sends (default: %(default)s)")
    add_token_option(where, used_with="--url")
    add_retry_options(where, deadline_s=DEADLINE_S)

    what = parser.add_argument_group("what to send (--sample, or the three numbers)")
    what.add_argument("--sample", type=Path, metavar="FILE",
                      help="groups of your data: a .jsonl or .parquet file with grrm score's columns, sent in "
                           "order and round again when it holds fewer than the run sends")
    what.add_argument("--input-format", choices=["parquet", "jsonl"], help="--sample's format when the name does not say")
    what.add_argument("--group-size", type=int, metavar="N", help="candidates per made group")
    what.add_argument("--source-words", type=int, metavar="W", help="words per made source")
    what.add_argument("--candidate-words", type=int, metavar="W", help="words per made candidate")
    add_column_options(parser)

    how = parser.add_argument_group("measuring")
    how.add_argument("--concurrency", default="1,2,4,8", metavar="C,C,...",
                     help="groups kept in flight, one point each (default: %(default)s)")
    how.add_argument("--groups-per-point", type=int, metavar="N",
                     help="groups sent at each concurrency (default: 4 x the concurrency, at least 16)")
    how.add_argument("--warmup-groups", type=int, default=_PROFILE["warmup_groups"].default,
                     metavar="N",
                     help="groups sent first and not measured (default: %(default)s)")
    how.add_argument("--max-failures", type=int, default=_PROFILE["max_failures"].default, metavar="N",
                     help="invalid answers tolerated; more stop the run, exit 1 (default: %(default)s)")
    how.add_argument("--cold-start-s", type=float, metavar="S",
                     help="the cold start to record instead of the replicas' own (needed with --url alone)")
    how.add_argument("--gpu", default="", metavar="TEXT", help="what a replica runs on, recorded (e.g. '1x H200')")

    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, required=True, metavar="PROFILE.json", help="the profile to write")
    out.add_argument("--json", action="store_true",
                     help="print the profile and each point's measurement as JSON instead of the table")
    parser.set_defaults(handler=main)
    return parser


def _checked(model: type, flag_of: dict[str, str] = FLAGS, **values: Any) -> Any:
    """``model(**values)``; a ValueError naming the option of its first bad field."""
    try:
        return model(**values)
    except ValidationError as error:
        field, _, message = field_error(error).partition(": ")
        raise ValueError(f"{flag_of.get(field.split('.')[0], field)}: {message}") from None


def settings_from_args(args: argparse.Namespace) -> ProfileSettings:
    """How to measure, checked; errors name the option."""
    try:
        concurrency = [int(part) for part in args.concurrency.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--concurrency: {args.concurrency!r} is not a list of integers (e.g. 1,2,4,8)") from None
    settings = _checked(ProfileSettings, concurrency=concurrency, groups_per_point=args.groups_per_point,
                        warmup_groups=args.warmup_groups, max_failures=args.max_failures)
    try:
        settings.check_groups()
    except ValueError as error:
        raise ValueError(f"--groups-per-point: {str(error).partition(': ')[2]}") from None
    if args.cold_start_s is not None and args.cold_start_s < 0:
        raise ValueError("--cold-start-s: must not be negative")
    return settings


def client_from_args(args: argparse.Namespace) -> ClientConfig:
    """The client's settings: HTTP with --url, else the handle of --app-name's application."""
    if args.url is None and args.app_name is None:
        raise ValueError("give --url URL or --app-name NAME (or both)")
    if args.url is not None and args.app_name is None and args.cold_start_s is None:
        raise ValueError("--url alone cannot read the replicas' cold starts: add --app-name NAME (on the Ray "
                         "cluster), or give --cold-start-s S (the controller's log says `cold start ... s`)")
    defaults = ClientConfig()
    return _checked(ClientConfig, transport="http" if args.url else "handle", tenant=args.tenant,
                    http_url=args.url or defaults.http_url, app_name=args.app_name or defaults.app_name,
                    token_env=args.token_env, deadline_s=args.deadline_s, max_attempts=args.max_attempts)


def groups_to_send(args: argparse.Namespace, count: int, tag: str) -> tuple[list[GroupRequest], int]:
    """``count`` groups to send (from --sample or made from the three numbers) and the group size to record."""
    numbers = {"group_size": args.group_size, "source_words": args.source_words,
               "candidate_words": args.candidate_words}
    given = [FLAGS[name] for name, value in numbers.items() if value is not None]
    if args.sample is not None:
        if given:
            raise ValueError(f"--sample gives the groups: drop {', '.join(given)}")
        groups = sample_groups(read_sample(args.sample, column_mapping(args), args.input_format, count), count, tag)
        return groups, round(sum(len(group.candidates) for group in groups) / len(groups))
    if len(given) < len(numbers):
        raise ValueError("give --sample FILE, or --group-size, --source-words and --candidate-words")
    shape = _checked(MadeGroups, **numbers)
    return made_groups(shape, count, tag), shape.group_size


def read_sample(path: Path, mapping: cols.ColumnMapping, input_format: str | None, rows: int) -> list[GroupRequest]:
    """The first ``rows`` groups of a dataset, read as ``grrm score`` reads it; a ValueError naming the file,
    the row and the column of one that is not a group."""
    groups: list[GroupRequest] = []
    try:
        for batch in read_rows(path, detect_format(path, input_format), batch_rows=min(rows, 1024)):
            for row in batch:
                group, problem = (None, row.problem) if row.problem else cols.to_group(row.values, mapping)
                if group is None:
                    raise ValueError(f"--sample {path}: row {row.index}: {problem}")
                groups.append(group)
                if len(groups) == rows:
                    return groups
    except DatasetError as error:
        raise ValueError(f"--sample: {error}") from None
    return groups


@dataclass(frozen=True)
class Service:
    """What the profile records of the service: its engine and model, the replicas serving, the cold start."""

    engine: str
    model: str
    replicas: int
    cold_start_s: float
    cold_start_from: str


async def read_service(args: argparse.Namespace, client: ClientConfig) -> Service:
    """The service's engine and model (GET /v1/info over HTTP, else a replica's info), its replicas, and
    the cold start: --cold-start-s, else the largest the running replicas measured of their own."""
    infos: list[dict[str, Any]] = []
    if args.app_name is not None:
        connect_app(args.app_name, args.address, flag="--app-name")
        from ray import serve

        from deployments.replica_list import replica_infos

        handle = serve.get_deployment_handle(client.replica_deployment, app_name=args.app_name)
        infos = list((await replica_infos(handle, args.app_name)).values())
        if not infos:
            raise SetupError(f"--app-name: no replica of {args.app_name!r} answered (none running yet?)")
    if args.url is not None:
        info = await asyncio.to_thread(service_info, client)
        replicas = int(info.get("replicas_running") or len(infos) or 1)
    else:
        info, replicas = infos[0], len(infos)
    if args.cold_start_s is not None:
        cold_start_s, source = args.cold_start_s, "given (--cold-start-s)"
    else:
        measured = sorted(info["cold_start_s"] for info in infos if info.get("cold_start_s") is not None)
        if not measured:
            raise SetupError("--app-name: no replica reports its cold start yet; give --cold-start-s S")
        cold_start_s = measured[-1]
        source = (f"the replicas' own, the largest of {len(measured)} ({', '.join(f'{s:.1f}' for s in measured)} s): "
                  "construction to serving, without Serve's scheduling of the replica's actor")
    engine = info["engine"]
    # The scripted engine names no model; a profile names one.
    return Service(engine=engine, model=info.get("model") or f"({engine} engine: no model)", replicas=replicas,
                   cold_start_s=cold_start_s, cold_start_from=source)


def row_of(window: Window) -> dict[str, Any]:
    """One measured concurrency as a row of the table (and of --json)."""
    point = point_of(window) if window.valid else None
    return {"concurrency": window.concurrency, "groups": len(window.answers), "valid": len(window.valid),
            "wall_s": round(window.wall_s, 3), "groups_per_s": point.groups_per_s if point else None,
            "tokens_per_s": point.tokens_per_s if point else None, "mean_latency_s": window.mean_latency_s}


class TooManyFailures(RuntimeError):
    """More invalid answers than --max-failures: the figures would not be the engine's."""


async def run_profile(args: argparse.Namespace) -> tuple[EngineProfile, list[Window], Service]:
    """Measure at each concurrency and return the profile, the windows and what the service said."""
    settings = settings_from_args(args)
    config = client_from_args(args)
    tag = uuid.uuid4().hex[:8]  # this run's groups are new to the service, whatever it scored before
    sizes = [settings.groups_at(concurrency) for concurrency in settings.concurrency]
    groups, group_size = groups_to_send(args, settings.warmup_groups + sum(sizes), tag)
    service = await read_service(args, config)
    client = RewardClient(config)

    async def send(group: GroupRequest):
        outcome = await client.score_group(group)
        return outcome.result, outcome.failure

    windows: list[Window] = []
    failed: Counter[str] = Counter()
    try:
        first = settings.warmup_groups
        if first:  # not measured: its failures count all the same (a service that fails, fails early)
            failed.update((await measure(send, groups[:first], min(first, settings.concurrency[0]))).failures)
        for concurrency, size in zip(settings.concurrency, sizes):
            window = await measure(send, groups[first:first + size], concurrency)
            first += size
            windows.append(window)
            print(f"grrm profile: concurrency {concurrency}: {len(window.valid)} of {size} groups valid in "
                  f"{window.wall_s:.1f} s", file=sys.stderr)
            failed.update(window.failures)
            if sum(failed.values()) > settings.max_failures:
                kinds = ", ".join(f"{kind}: {count}" for kind, count in sorted(failed.items()))
                raise TooManyFailures(f"{sum(failed.values())} invalid answers (more than --max-failures "
                                      f"{settings.max_failures}): {kinds}")
    finally:
        await client.aclose()
    after = await read_service(args, config)
    if after.replicas != service.replicas:
        print(f"grrm profile: warning: the pool went from {service.replicas} to {after.replicas} replicas while "
              "measured; the figures mix both: fix its size (num_replicas) and measure again", file=sys.stderr)
    try:
        profile = profile_of(windows, engine=service.engine, model=service.model, group_size=group_size,
                             cold_start_s=service.cold_start_s, cold_start_from=service.cold_start_from,
                             replicas=max(service.replicas, after.replicas), gpu=args.gpu)
    except ValueError as error:  # a concurrency without one valid answer, --max-failures notwithstanding
        raise TooManyFailures(str(error)) from None
    return profile, windows, service


def main(args: argparse.Namespace) -> int:
    """Run ``grrm profile``; exit 0 with the profile written, 1 when measuring failed, 2 on bad usage."""
    try:
        profile, windows, service = asyncio.run(run_profile(args))
    except (ValueError, SetupError, DatasetError, cols.ColumnsError) as error:
        print(f"grrm profile: error: {error}", file=sys.stderr)
        return 2
    except TooManyFailures as error:
        print(f"grrm profile: stopped: {error}; no profile written", file=sys.stderr)
        return 1
    args.out.write_text(profile.model_dump_json(indent=2) + "\n")
    rows = [row_of(window) for window in windows]
    if args.json:
        print(json.dumps({"profile": profile.model_dump(), "points": rows}, indent=2))
        return 0
    print_table(rows)
    print(f"{service.engine} engine, model {service.model}, {service.replicas} replica(s) serving "
          f"(the profile counts one replica's share); groups of {profile.group_size}, "
          f"{profile.tokens_per_group or 0:.0f} tokens a group")
    print(f"cold start {profile.cold_start_s:.1f} s: {profile.cold_start_from}")
    print(f"wrote {args.out}")
    return 0

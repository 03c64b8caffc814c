"""Write the benchmarks' page, docs/benchmarks.md, from bench/results/*.json: the plots first, each
with its figures, then the latest table of each benchmark, the command that produced it and the
machine it ran on. Figures and tables are read from the results, so they cannot drift from them;
the plots are the PNGs each benchmark wrote in the run that wrote its JSON (``docs/plots/``, beside
the page: ``bench.common.plot_path``). No absolute path of the measuring machine reaches the page (``relative_paths``).

    .venv/bin/python -m bench.report
"""

from __future__ import annotations

import importlib
import json
import re
import statistics
from pathlib import Path
from typing import Any

from bench.common import plot_path, results_dir
from bench.fair_share import VERL_COLUMNS as FAIR_SHARE_VERL_COLUMNS
from bench.hostile_tenants import ANNOUNCEMENT_COLUMNS, REFUSAL_COLUMNS, STALL_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "benchmarks.md"
# An absolute path on the machine that measured (a checkout, a temporary directory, a home):
# the page shows it relative to the project, or by its last part (a URL's path is left alone).
MACHINE_PATH = re.compile(r"(?<![\w.~:/-])(?:/work|/tmp|/root|/home|/Users|/mnt|/var/folders|/private)(?:/[\w.+@-]+)+")
# bench.autoscaling_sim's table: an elastic pool against a fixed pool per run (4b, and its min_replicas 0 run).
SIMULATION_COLUMNS = ["demand_headroom", "runs", "fixed_pool_per_run", "replica_seconds_fixed_vs_elastic",
                      "fixed_exposed_s_mean", "elastic_exposed_s_mean", "exposed_elastic_vs_fixed"]



PLAN_CHECK_COLUMNS = ["pool", "exposed_s_predicted", "exposed_s_repredicted", "exposed_s_measured",
                      "replica_s_per_step_predicted", "replica_s_per_step_repredicted", "replica_s_per_step_measured",
                      "replica_s_error_predicted", "ok_predicted", "ok_repredicted", "peak_predicted", "peak_measured",
                      "members_lost", "model_missed"]


def plot_link(name: str) -> str:
    """A link from the page to a benchmark's plot (a link to a plot that is missing fails the strict
    docs build)."""
    return f"[`docs/plots/{name}.png`](plots/{name}.png)"


def relative_paths(text: str) -> str:
    """``text`` with every absolute path of the measuring machine made relative to the project (from
    the first part that is one of its top-level entries: ``/work/main/models/tiny`` -> ``models/tiny``),
    or cut to its last part when it lies outside any checkout (``/tmp/abc/run.json`` -> ``run.json``)."""
    # models/: where scripts/ put the local models (not committed, so not always on this disk).
    top_level = {entry.name for entry in ROOT.iterdir() if not entry.name.startswith(".")} | {"models"}

    def relative(match: re.Match) -> str:
        parts = match.group(0).strip("/").split("/")
        inside = next((index for index, part in enumerate(parts) if part in top_level), None)
        return "/".join(parts[inside:]) if inside is not None else parts[-1]

    return MACHINE_PATH.sub(relative, text)


def ratio(value: float) -> str:
    """A ratio as the page's prose writes it: 2.07x, 18.5x."""
    return f"{fmt(value)}x"


def glance_overlap(overlap: list[dict]) -> str:
    """The headline: exposure at reward time equal to generation time (n = 8), streamed against the bound."""
    rows = {row["mode"]: row for row in overlap
            if row["simulated"] and row["n"] == 8 and row["reward_to_generation"] == 1.0}
    if not {"streamed", "colocated_sequential"} <= rows.keys():
        return ""
    streamed, colocated = rows["streamed"], rows["colocated_sequential"]
    return ("Streaming complete groups to the reward pool exposes almost only what no schedule can hide: at "
            f"reward time equal to generation time (n = 8), {fmt(streamed['exposed_reward_s'])} s of reward per "
            f"step is exposed against a bound of {fmt(streamed['limit_exposed_s'])} s, where scoring after the "
            f"batch on the policy's GPUs exposes {fmt(colocated['exposed_reward_s'])} s (`bench.overlap`, "
            "simulated rows; section 1).")


def glance_autoscale(autoscaling: dict) -> str:
    """The project's policy and Serve's default against the fixed pool, on real Serve."""
    rows = {row["policy"]: row for row in autoscaling["rows"]}
    if not {"fixed", "engine_work", "serve_default"} <= rows.keys():
        return ""
    fixed, ours, serve = rows["fixed"], rows["engine_work"], rows["serve_default"]
    return ("On real Serve (scripted engine) through the same GRPO steps, the project's policy holds "
            f"{fmt(ours['replica_seconds'])} replica-seconds against the fixed pool's {fmt(fixed['replica_seconds'])} "
            f"({ratio(ours['replica_seconds_vs_fixed'])} fewer) at {ratio(ours['exposed_vs_fixed'])} its exposure; "
            f"Serve's default policy holds {fmt(serve['replica_seconds'])} but exposes "
            f"{ratio(serve['exposed_vs_fixed'])} as much (`bench.autoscale`; section 4).")


def glance_simulation(simulation: dict) -> str:
    """Four runs on one elastic pool against a fixed pool per run, at the configured headroom and at 2."""
    runs = max(row["runs"] for row in simulation["rows"])
    headroom = simulation["inputs"]["demand_headroom"]
    by_headroom = {row["demand_headroom"]: row for row in simulation["rows"] if row["runs"] == runs}
    row = by_headroom.get(headroom)
    if row is None:
        return ""
    wider = by_headroom.get(2.0)
    return (f"Simulated at {simulation['inputs']['gpus']} GPUs: {runs} runs sharing one elastic pool (demand_headroom "
            f"{fmt(headroom)}) hold {fmt(row['elastic_replica_seconds'])} replica-seconds against "
            f"{fmt(row['fixed_replica_seconds'])} for a fixed pool of {row['fixed_pool_per_run']} per run "
            f"({ratio(row['replica_seconds_fixed_vs_elastic'])} fewer) at {ratio(row['exposed_elastic_vs_fixed'])} "
            f"its mean exposure ({fmt(row['elastic_exposed_s_mean'])} s against {fmt(row['fixed_exposed_s_mean'])} s"
            + (f"; at headroom 2, {ratio(wider['replica_seconds_fixed_vs_elastic'])} fewer at "
               f"{ratio(wider['exposed_elastic_vs_fixed'])} the exposure" if wider and headroom != 2.0 else "")
            + "); replicas rise with each run's generation and fall in its training (`bench.autoscaling_sim`; "
            "section 4b).")


def glance_fair_share(fair_share: list[dict]) -> str:
    """A small run beside an engine-bound flood, fair share against first come first served; weights;
    the HTTP-bound flood."""
    flood = {(row["case"], row["mode"]): row for row in fair_share if row["case"] in ("engine_bound", "http_bound")}
    shares = [row for row in fair_share if row["case"] == "weights"]
    if not {("engine_bound", "fair"), ("engine_bound", "fifo")} <= flood.keys():
        return ""
    fair, fifo = flood["engine_bound", "fair"], flood["engine_bound", "fifo"]
    text = (f"Beside a tenant flooding the engine with {fair['flood_groups']} groups, a small run's last reward "
            f"comes {ratio(fair['beside_over_alone'])} as late as alone under fair share, against "
            f"{ratio(fifo['beside_over_alone'])} first come, first served")
    if shares:
        text += (f"; weighted tenants get {'exactly ' if all(row['share_over_weighted_share'] == 1.0 for row in shares) else ''}"
                 f"their weights ({', '.join(fmt(row['share']) for row in shares)}) while all are backlogged")
    text += "."
    http_fair, http_client = flood.get(("http_bound", "fair")), flood.get(("http_bound", "fair+flood_client_32"))
    if http_fair and http_client:
        text += (f" A flood that saturates HTTP rather than the engine is another matter: "
                 f"{ratio(http_fair['beside_over_alone'])} under fair share alone, "
                 f"{ratio(http_client['beside_over_alone'])} once the flood's client sends at most 32 groups at once")
    return text + " (`bench.fair_share`; section 15)."


def glance_plan_check(checked: dict) -> str:
    """grrm plan's prediction against what real Serve then did, per pool."""
    rows = checked["rows"]
    two_runs = load("plan_check_2runs")
    within = "within the targets for every pool" if all(row["ok_predicted"] for row in rows) else \
        "outside the targets for some pool (`ok_predicted`)"
    return (f"`grrm plan`'s replay of a GRPO trace predicted what real Serve then did {within}: replica-seconds "
            "per step " + ", ".join(f"{row['replica_s_error_predicted'] * 100:+.1f}%" for row in rows)
            + " off the measured for " + ", ".join(f"`{row['pool']}`" for row in rows)
            + ", mean exposure " + ", ".join(fmt(row["exposed_s_predicted"]) for row in rows) + " s against "
            + ", ".join(fmt(row["exposed_s_measured"]) for row in rows) + " s measured"
            + ("; two runs sharing the pool likewise" if two_runs and all(row["ok_predicted"] for row in two_runs["rows"])
               else "")
            + " (`bench.plan_check`, scripted engine; section 4f; [sizing a pool](operations/sizing.md)).")


# The plots shown first: (results, heading, the plot's alt text, its figures from the results).
GLANCE = (
    ("overlap", "Exposed reward against the limit", "Exposed reward time against the bound no schedule can beat",
     glance_overlap),
    ("autoscale", "Replicas over time: a fixed pool, Serve's policy and the project's",
     "Running replicas per policy on real Serve", glance_autoscale),
    ("autoscaling_sim", None, "Replicas against the work waiting, four runs on one elastic pool", glance_simulation),
    ("fair_share", "Fair share under a flood", "A small run beside a flood, first come first served against fair share",
     glance_fair_share),
    ("plan_check", "Predicted against measured", "grrm plan's predicted replicas over time against real Serve's, per pool",
     glance_plan_check),
)


def at_a_glance() -> list[str]:
    """The page's first section: each headline plot, then its figures (a heading of None joins the one before)."""
    parts = ["## Results at a glance", "",
             "Each plot is a benchmark's own output (`docs/plots/*.png`, written in the run that wrote its "
             "`bench/results/*.json`); its numbers are in the sections further down.", ""]
    for name, heading, alt, figures in GLANCE:
        results = load(name)
        if not results or not plot_path(name).exists():
            continue
        if heading:
            parts += [f"### {heading}", ""]
        parts += [f"![{alt}](plots/{name}.png)", ""]
        caption = figures(results)
        if caption:
            parts += [caption, ""]
    return parts


def autoscale_tables(autoscaling: dict, name: str) -> str:
    """bench.autoscale's tables: the pools' costs and exposures, the exposure per step, the project's
    pools against Serve's default, and where the plot is."""
    steps = autoscaling["workload"]["steps"]
    # Runs that counted starting and stopping replicas as well report the serving ones apart.
    serving = ["serving_replica_seconds"] if "serving_replica_seconds" in autoscaling["rows"][0] else []
    return (table(autoscaling["rows"], ["policy", "replica_seconds", *serving, "replica_seconds_vs_fixed",
                                        "exposed_s_mean", "exposed_vs_fixed", "exposed_s_max", "peak_replicas",
                                        "members_lost"])
            + "\n\nExposed reward per step (last reward minus last member sent):\n\n"
            + table([{"policy": run["policy"], **{f"step {step['step']}": step["exposed_s"] for step in run["steps"]}}
                     for run in autoscaling["runs"]], ["policy", *[f"step {step}" for step in range(steps)]])
            + against_serve_default(autoscaling["rows"])
            + f"\n\nReplicas over time: {plot_link(name)}.")


def against_serve_default(rows: list[dict]) -> str:
    """The project's pools against Serve's default policy (target 64) of the same run: how many times
    fewer replica-seconds, at what exposure (issue 29's target: >= 1.5x fewer at <= 1x the exposure)."""
    serve = next((row for row in rows if row["policy"] == "serve_default"), None)
    ours = [row for row in rows if row["policy"].startswith("engine_work")]
    if serve is None or not ours:
        return ""
    compared = [{"policy": row["policy"],
                 "replica_seconds_serve_default_vs_this": serve["replica_seconds"] / row["replica_seconds"],
                 "exposed_this_vs_serve_default": row["exposed_s_mean"] / serve["exposed_s_mean"]} for row in ours]
    return ("\n\nThe project's pools against Serve's default policy (target 64) in the same run: how many times "
            "fewer replica-seconds, at what share of its exposure:\n\n"
            + table(compared, ["policy", "replica_seconds_serve_default_vs_this", "exposed_this_vs_serve_default"]))

def repeated_run(name: str) -> str:
    """bench.autoscale's results ``name``, where they exist: a second run of some of a section's pools
    (exposure is noisy on a shared 2-core machine: one slow step moves a 10-step mean by a tenth), with
    each pool's median step beside the mean."""
    repeat = load(name)
    if not repeat:
        return ""
    policies = ",".join(row["policy"] for row in repeat["rows"])
    medians = {run["policy"]: statistics.median(step["exposed_s"] for step in run["steps"]) for run in repeat["runs"]}
    fixed = medians.get("fixed")
    rows = [{**{key: row[key] for key in ("policy", "replica_seconds", "replica_seconds_vs_fixed", "exposed_s_mean",
                                          "exposed_vs_fixed")},
             "exposed_s_median": medians[row["policy"]],
             "median_exposed_vs_fixed": medians[row["policy"]] / fixed if fixed else None} for row in repeat["rows"]]
    return (f"\n\nA second run of the same workload, another time (`--policies {policies} --name {name}`), "
            "ratios within it; the median step's exposure beside the mean:\n\n"
            + table(rows, list(rows[0])))


def from_zero_simulation(simulation: dict | None) -> str:
    """4b's simulation with ``min_replicas`` 0 (``bench.autoscaling_sim --min-replicas 0``), where it ran."""
    if not simulation:
        return ""
    return ("\n\nThe same with `min_replicas` 0 (`.venv/bin/python -m bench.autoscaling_sim --min-replicas 0`): the "
            "shared pool empties while every run trains:\n\n"
            + table(simulation["rows"], SIMULATION_COLUMNS))


def load(name: str) -> Any | None:
    path = results_dir() / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def meta(name: str) -> dict:
    return load(f"{name}.meta") or {}


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{key} {fmt(item)}" for key, item in value.items())
    return str(value)


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def machine_line(name: str) -> str:
    info = meta(name).get("machine", {})
    return f"Machine: {info.get('cpus', '?')} CPUs, Python {info.get('python', '?')}, measured {info.get('when', '?')}."


def engine_pairs(rows: list[dict]) -> list[dict]:
    """bench/engines.py's rows (a plain row, then its engine row) as one row per case."""
    pairs = []
    for plain, engine in zip(rows[::2], rows[1::2]):
        pairs.append({**engine, "plain_tokens_per_s": plain["tokens_per_s"], "engine_tokens_per_s": engine["tokens_per_s"]})
    return pairs


def hang_rerun() -> str:
    """The engine-hang row re-measured with the hang timeout, when that run exists."""
    rerun = load("chaos_engine_core_hang")
    if not rerun:
        return ""
    rows = [row for row in rerun["phases"] if row["phase"] in ("baseline", "engine_core_hang")]
    return (
        "\n\nThe hang again, after the replica's health probe got its own bound (`hang_timeout_s` 8 s, "
        "`health_check_period_s` 5 s; the table above predates it), with the baseline under the same full load "
        "(`replicas_replaced`: replicas Serve replaced during the phase; 0 without a fault = no false hang alarm). "
        "Command: `.venv/bin/python -m bench.chaos --faults engine_core_hang`.\n\n"
        + table(rows, ["phase", "members_sent", "members_valid", "members_lost", "groups_duplicated", "split_groups",
                       "replicas_replaced", "in_flight_at_fault", "recovery_s", "replicas_back_s", "max_latency_s"])
    )


def section(title: str, command: str, body: str, name: str | None, note: str = "") -> str:
    parts = [f"## {title}", "", f"Command: `{command}`", ""]
    if name:
        parts += [machine_line(name), ""]
    if note:
        parts += [note, ""]
    return "\n".join(parts + [body, ""])


HANDLE_PATH_NOTE = (
    "The product's Serve handle path against a bare Ray Serve deployment doing the same engine work (a "
    "`GroupScorer`, nothing else), one layer at a time: the group-aware router, the `GRRMReplica` (metrics, "
    "outstanding-work accounting, assembler), `ScorerClient` (retry on replica death, availability check, a request "
    "id per call), and the trainer bridge's path, one `add_member` call per rollout assembled on the replica (4 "
    "per group). One replica, a closed loop of 128 groups in flight, paths interleaved over rounds; ratios to "
    "`bare_serve` in the same round. `cpu_ms_per_call_*`: CPU milliseconds per call of the driver (the caller and "
    "the handle's router loop), the replica, the ledger replicas, and every other process (controller, proxy, "
    "raylet, GCS), from `psutil`: on 2 cores the path is CPU-bound, so CPU per call is where the time goes. Engines are "
    "scripted (simulated): `zero` answers at once. What it shows: the router, replica and client layers stay within "
    "the round-to-round spread of bare Serve; Serve's own call (about 2.3 ms of caller CPU and 2 ms in the replica) "
    "bounds the path. The member path adds its ledger traffic, per group one lookup and one write per ledger copy "
    "(this bench runs one copy, `grrm.yaml` two), each a Serve call of its own. Rounds rotate the path order: with "
    "`bare_serve` always first, one earlier run put every other path at 0.71-0.80. Coalescing the ledger's calls "
    "(a group commit, tried and withdrawn) cut `cpu_ms_per_group_ledger` to about 0.7 ms in a run of its "
    "own."
)

HALF_COST_NOTE = (
    "A run of its own, set up as section 9 (the same SIMULATED reward cost model) at half the cost: a batch's "
    "scoring takes 0.5x the zero-cost sync run's generation time ({calibration} s). Ratios within this run only. "
    "Each row also records the median of every phase verl times (`phases_s`); the second table is each phase's "
    "growth over the mode's zero-cost run. The step waits for rewards only inside `gen` (generation plus the reward "
    "wait in sync and legacy; the wait for a ready batch in the asynchronous modes; one_step_off times its "
    "generation, which overlaps training, as `generate_async`); growth in the training phases is generation competing with training for the same 2 cores (docs/exposure.md, \"Step time\"). One "
    "configuration's step time moves by more than 5% from run to run on this machine (the zero-cost sync step: "
    "{main_sync} s in section 9's run, {this_sync} s in this one), so a step ratio near 1 is good to about +-15% here."
)


# Benches that write their own section (report_section): issue 58's rehearsal of production on this
# machine (16), issue 56's reward recipe (17).
OWN_SECTIONS = (("16", "node_fleet"), ("16b", "topology"), ("16c", "recipe_size"),
                ("17", "language_gate"), ("17b", "recipe_overhead"))


def own_sections() -> list[str]:
    """The sections the benches write themselves, numbered here, for those whose results exist."""
    sections = []
    for number, name in OWN_SECTIONS:
        results = load(name)
        if results:
            body = importlib.import_module(f"bench.{name}").report_section(results)
            sections.append("\n" + body.replace("## ", f"## {number}. ", 1))
    return sections


def render() -> str:
    """The whole page, from the results as they are now."""
    sections = [
        "# Benchmarks",
        "",
        "<!-- Generated by `.venv/bin/python -m bench.report` from bench/results/*.json: edit bench/report.py,",
        "     not this page (tests/test_docs_site.py fails when it falls behind the results). -->",
        "",
        *at_a_glance(),
        "## All benchmarks",
        "",
        "`bench/` holds one command per benchmark (overlap, serving overhead, routing, autoscaling, GQM vs",
        "SQM cost, ensembles, verdict repair, soak, chaos, node chaos, engine cost, tensor parallelism,",
        "verl's real trainer in each trainer mode, tenants, the production rehearsal, reward recipes). Each",
        "prints a table and writes `bench/results/<name>.json` (and `docs/plots/<name>.png` where a curve",
        "says more); this",
        "page is generated from those results by `.venv/bin/python -m bench.report`. Figures are ratios or",
        "distributions taken side by side in one run; absolute times are context only (a shared 2-core",
        "machine, no GPU). Rows marked simulated use the scripted engine; the others run the CPU build of",
        "vLLM on the tiny model.",
        "",
        "The test suite runs each benchmark with `--quick` (which proves that it runs, not what it",
        "measures), except `bench.verl_trainer` (real trainings, minutes each: its arithmetic is tested",
        "alone, the trainer modes it runs by `tests/verl_trainer/`); run its `--quick` by hand after",
        "changing it. `bench.node_chaos --quick --redis --head-down-s 10` runs as",
        "`tests/reliability/test_node_faults.py`.",
        "",
    ]
    overlap = load("overlap")
    if overlap:
        rows = [r for r in overlap if r["simulated"] and r["n"] == 8] + [r for r in overlap if not r["simulated"]]
        sections.append(section(
            "1. Overlap (headline)", ".venv/bin/python -m bench.overlap",
            table(rows, ["n", "reward_to_generation", "mode", "simulated", "step_s", "exposed_reward_s",
                         "limit_exposed_s", "step_vs_colocated", "hidden_reward_share", "exposed_vs_limit"])
            + "\n\nStreamed, every n (simulated), exposed reward / limit:\n\n"
            + table([r for r in overlap if r["simulated"] and r["mode"].startswith("streamed")],
                    ["n", "reward_to_generation", "mode", "exposed_reward_s", "limit_exposed_s", "exposed_vs_limit"])
            + "\n\nAll rows: `bench/results/overlap.json`; plot: " + plot_link("overlap") + ".",
            "overlap",
            "Simulated rows: long-tailed rollout lengths, reward work scaled to the given ratio, colocated mode "
            "pays an assumed 2 s reward-model swap per step. `limit_exposed_s`: the bound `F` of docs/exposure.md "
            "minus the generation time: no schedule of the same groups (released when they complete) on the same "
            "8 reward slots exposes less. `streamed` serves complete groups first come, first served; "
            "`streamed_largest_first` takes the largest waiting group first. The non-simulated rows are the real "
            "`examples/grpo_overlap.py` run (tiny policy on vLLM-CPU, reward cluster on local Ray Serve).",
        ))
    serving = load("serving")
    if serving:
        sections.append(section(
            "2. Serving overhead", ".venv/bin/python -m bench.serving --scale 0.5",
            table(serving, ["engine", "path", "concurrency", "requests", "groups_per_s", "p50_ms", "p99_ms",
                            "added_p50_ms", "throughput_vs_in_process"]),
            "serving",
            "Targets: under 5 ms added at p50 and under 10% of in-process throughput lost at concurrency 128. "
            "On this 2-core machine the handle path meets the p50 target at concurrency 1 only; HTTP and high "
            "concurrency miss both targets: the load generator, the HTTP proxy, the ingress and the replica "
            "share two cores. Engines are scripted (simulated).",
        ))
    handle_path = load("handle_path")
    if handle_path:
        from bench.handle_path import COLUMNS as HANDLE_PATH_COLUMNS

        sections.append(section(
            "2b. Where the handle path's time goes", ".venv/bin/python -m bench.handle_path",
            table(handle_path, HANDLE_PATH_COLUMNS), "handle_path", HANDLE_PATH_NOTE,
        ))
    routing = load("routing")
    if routing:
        sections.append(section(
            "3. Routing and prefix caching", ".venv/bin/python -m bench.routing",
            table(routing["rows"], ["router", "replicas", "groups", "requests_per_group", "prefix_cache_hit_rate",
                            "repeat_hit_rate", "tokens_computed_per_group", "tokens_computed_vs_default",
                            "groups_on_one_replica"]),
            "routing",
            "Real vLLM-CPU replicas (2) with prefix caching; each group asked for 3 times with the same id.",
        ))
    autoscaling = load("autoscale")
    if autoscaling:
        workload = autoscaling["workload"]
        sections.append(section(
            "4. Autoscaling under GRPO steps: a fixed pool, Serve's policy, the project's",
            ".venv/bin/python -m bench.autoscale",
            autoscale_tables(autoscaling, "autoscale"),
            "autoscale",
            f"SIMULATED engine (scripted: {workload['per_group_s']} s a group, one at a time per replica, "
            f"{workload['start_s']} s engine start), real Ray Serve and HTTP. A GRPO run of {workload['steps']} "
            f"steps: {workload['groups']} groups of {workload['group_size']} members whose rollouts finish at "
            f"random times within a {workload['generation_s']} s generation phase, then {workload['training_s']} s "
            f"of training; the trainer starts for {workload['trainer_start_s']} s first. `fixed`: "
            f"{workload['max_replicas']} replicas (the peak's). `serve_default`: Serve's policy on ongoing "
            "requests, target 64 as grrm.yaml had it (delays scaled to this run: up 2 s, down 4 s), which counts "
            "members waiting for group-mates as load; `serve_default_<N>` the same at target N (16: the "
            "configuration's default; 4; 1), which scale sooner: even at target 1 it starts replicas when a phase's "
            "members come, a start too late for its crowd (complete groups queued on a replica move to the replicas "
            "added, so each scale-up helps at once). `engine_work`: the project's policy, the client announcing "
            "its first step while it starts and each next step ahead, each with the profile of when in the phase "
            "its groups complete (the step before's; before any, rollouts assumed even), the pool sized for the "
            "busiest slice a cold start ahead (down delay 4 s; 1 s once the pool is idle between announced "
            "phases: no group queued or running, no member waiting); `engine_work_2` the same with at most 2 "
            "replicas, to compare costs with Serve's policy at about its exposure; `engine_work_min0[_2]` the same "
            "with `min_replicas` 0: the pool empties while the trainer trains and starts again a cold start ahead "
            "of the next announced phase (the application-level policy, which hears the announcement through the "
            "HTTP ingress while no scorer replica runs; every pool is deployed as `serve run "
            "deployments/grrm.yaml` deploys). Replica-seconds count running replicas (a starting one is not "
            "counted). Ratios within this run.",
        ))
    from_zero = load("autoscale_min0")
    if from_zero:
        sections.append(section(
            "4a. Autoscaling from zero, ahead of each announced step",
            ".venv/bin/python -m bench.autoscale --steps 10 --name autoscale_min0 "
            "--policies fixed,serve_default,engine_work_min0,engine_work_min0_2",
            autoscale_tables(from_zero, "autoscale_min0"),
            "autoscale_min0",
            "Section 4's workload and pools, a run of its own: the project's policy with `min_replicas` 0 "
            "against the fixed pool and Serve's default, after the HTTP ingress hands its copy of announced "
            "work to a scorer replica when the phase starts (section 4's run, before that, started a replica "
            "for about 2 s after each step). Ratios within this run.",
        ))
    simulation = load("autoscaling_sim")
    if simulation:
        inputs = simulation["inputs"]
        sections.append(section(
            "4b. SIMULATED: one elastic pool for 1-4 runs against a fixed pool per run, at 64 GPUs",
            ".venv/bin/python -m bench.autoscaling_sim",
            table(simulation["rows"], SIMULATION_COLUMNS)
            + "\n\nReplicas over time against the groups waiting, 4 runs: " + plot_link("autoscaling_sim") + "."
            + ("\n\nThe same runs on one pool scaled by a model of Serve's default policy (ongoing requests, waiting "
               "members included, over `serve_target` a replica; up after 30 s, down after 300 s, as grrm.yaml had "
               f"it), against the project's pool at demand_headroom {inputs['demand_headroom']} and the fixed pools:\n\n"
               + table(simulation["serve_default_rows"],
                       ["runs", "serve_target", "replica_seconds_serve_vs_elastic", "replica_seconds_fixed_vs_serve",
                        "serve_exposed_s_mean", "exposed_serve_vs_elastic"])
               if simulation.get("serve_default_rows") else "")
            + from_zero_simulation(load("autoscaling_sim_min0")),
            "autoscaling_sim",
            f"SIMULATED (no Ray, no engine): the project's decision function itself sizes the shared pool every "
            f"second. Inputs (assumptions): {inputs['seconds_per_group']} engine seconds a group on one replica, "
            f"{inputs['cold_start_s']} s cold start, {inputs['steps']} steps of {inputs['groups']} groups of "
            f"{inputs['group_size']} rollouts, {inputs['generation_s']} s generation then {inputs['training_s']} s "
            "training, runs at random offsets. Each run announces as its trainer's client does "
            "(grrm_client/demand.py's forecast, fed the run's rollout times): its first step while it starts, then "
            "each phase as it opens and the next one ahead, with the profile of when in the phase its groups "
            "complete (at their last rollout: they crowd the phase's end), learned from the phases before; the "
            "pool grows for the busiest slice a cold start ahead, times `demand_headroom` (rows by headroom; "
            f"demand grace {inputs.get('demand_grace_s', 30.0)} s, "
            f"down delay {inputs.get('downscale_delay_s', 60.0)} s, "
            f"{inputs.get('idle_downscale_delay_s', inputs.get('downscale_delay_s', 60.0))} s once the pool is idle "
            "within an announced phase, at once between them). "
            "A fixed pool per run is the smallest within 5% of the exposure the cluster's share would give it. "
            "Groups wait in one queue any free replica takes from (an ideal pool; `grrm plan` replays the "
            "service's ring instead, section 4f). A group complete within a second's tick starts when it completes "
            "(until 2026-11-29 the model started it at the next tick, 0.5 s later on average: every exposure "
            "was higher, and the fixed pools per run came out at 8 replicas instead of 10).",
        ))
    sleeping = load("autoscaling_sim_sleep")
    if sleeping:
        inputs = sleeping["inputs"]
        sections.append(section(
            "4c. SIMULATED: idle replicas removed or kept asleep (vLLM sleep mode), at 64 GPUs",
            ".venv/bin/python -m bench.autoscaling_sim --idle sleep",
            table(sleeping["rows"], ["runs", "pool", "demand_headroom", "replica_seconds", "awake_replica_seconds", "cost",
                                     "cost_fixed_vs_this", "cost_stop_vs_this", "exposed_s_mean", "exposed_vs_fixed"]),
            "autoscaling_sim_sleep",
            "SIMULATED as 4b (at 4b's demand_headroom and at a lower one), the elastic pool's idle replicas either "
            "removed (`stop`, 4b's pool) or kept asleep (`replicas.autoscaling.idle: sleep`): each replica's "
            "engine sleeps after `sleep_after_s` without work and wakes for a group (which waits) or ahead of an "
            "announced phase it holds (cluster/engine_sleep.py); the pool keeps asleep the replicas an announced "
            "need within the break-even horizon (cold_start_s - wake_s) / sleeping_cost will use. Assumptions: "
            f"wake_s {inputs['wake_s']} s (a 7B model's weights back from pinned CPU memory; not measured: the sleep "
            f"mode needs CUDA), sleeping_cost {inputs['sleeping_cost']} (a sleeping replica holds its GPU but frees "
            "its memory). `cost` = awake replica-seconds + sleeping_cost x asleep ones; `fixed` is 4b's pool per run; "
            "`cost_stop_vs_this` against `stop` at the same headroom. A replica woken in seconds instead of started "
            "in a cold start lets the pool run with less headroom at the same exposure.",
        ))
    later = load("autoscale_lazy")
    if later:
        sections.append(section(
            "4d. Replicas started when a phase's work needs them, at the cold start the pool measured",
            ".venv/bin/python -m bench.autoscale --steps 10 --name autoscale_lazy "
            "--policies fixed,serve_default,engine_work,engine_work_min0,engine_work_min0_2",
            autoscale_tables(later, "autoscale_lazy"),
            "autoscale_lazy",
            "Section 4's workload and pools, a run of its own, after two changes to the policy: an announced "
            "phase counts only from when its expected work reaches `target_backlog_s` (its first few groups "
            "start no replica ahead), and the cold start it plans with is the one it timed (asking for "
            "replicas to one serving: here 3.5-5.5 s by the timelines, 2 to 4 replicas starting at once on "
            "2 cores, against the 6 s configured). Replica-seconds here count "
            "every replica that holds its resources, starting and stopping ones too (a replica loads its "
            "engine on its GPU), `serving_replica_seconds` the running ones; sections 4 and 4a counted running "
            "replicas only. Ratios within this run.",
        ))
    ahead = load("autoscale_phase_ahead")
    if ahead:
        sections.append(section(
            "4e. A replica by each phase's first group, an idle pool dropped at once between phases",
            ".venv/bin/python -m bench.autoscale --steps 10 --name autoscale_phase_ahead "
            "--policies fixed,serve_default,engine_work,engine_work_min0,engine_work_min0_2",
            autoscale_tables(ahead, "autoscale_phase_ahead") + repeated_run("autoscale_phase_ahead_repeat"),
            "autoscale_phase_ahead",
            "Section 4d's workload, pools and count (replicas starting, running and stopping), a run of its own, "
            "after three changes to the policy: an announced phase has one replica serving by its first expected "
            "group (a pool at `min_replicas` 0 made those groups wait a cold start, and queue into the phase's "
            "crowd); a pool idle while every announced phase lies ahead (the trainer announced its next one) drops "
            "at once instead of after `idle_downscale_delay_s`; and the cold start the policy plans with is timed "
            "from asking for a replica count to all of it serving (4d timed it to the first new one; here a pool "
            "grown 0 -> 4 had all 4 serving 5-8 s after its first ask, 1 -> 4 4-6 s). Ratios within this run.",
        ))
    for name, runs in (("plan_check", "one run"), ("plan_check_2runs", "two runs sharing the pool"),
                       ("plan_check_trace", "a trace verl's reward workers recorded")):
        checked = load(name)
        if checked:
            profile = checked["profile"]
            sections.append(section(
                f"4f. grrm plan's predictions against real Serve: {runs}",
                ".venv/bin/python -m bench.plan_check" + {"plan_check": "", "plan_check_2runs": " --runs 2",
                                                          "plan_check_trace": " --trace bench/traces/verl_cpu_harness_worker1.json "
                                                                              "--trace bench/traces/verl_cpu_harness_worker2.json"}[name],
                table(checked["rows"], PLAN_CHECK_COLUMNS) + f"\n\nPlot: {plot_link(name)}.",
                name,
                "The same trace(s) predicted by `grrm plan`'s replay (`cluster/planning/replay.py`, the settings the "
                "deployed pool runs) and replayed on real Serve (scripted engine, SIMULATED costs; HTTP through "
                "`RewardClient`, phases announced by the adapters' `DemandAnnouncer`). Profile: "
                f"{profile['seconds_per_group']:g} s per group, cold start {profile['cold_start_s']:.1f} s "
                f"({profile['source']}). `repredicted`: the same replay fed the run's own measured seconds per "
                "group and cold start. Targets: replica-seconds within 15%, mean exposure within 20% or 0.5 s "
                "(whichever is larger); `ok_*` says whether both hold. `model_missed`: the model's inputs or parts "
                "that measured otherwise (`-`: none).",
            ))
    cost = load("gqm_vs_sqm")
    if cost:
        sections.append(section(
            "5. GQM vs SQM cost", ".venv/bin/python -m bench.gqm_vs_sqm",
            table(cost["rows"], ["protocol", "group_size", "prompts", "answer_tokens", "tokens_per_candidate",
                         "computed_tokens_per_candidate", "wall_ms_per_candidate", "tokens_vs_sqm", "wall_vs_sqm"]),
            "gqm_vs_sqm",
            "Real vLLM-CPU, fixed answer lengths (GQM: 64 + 48 per candidate; SQM: 96). GQM spends fewer tokens "
            "per candidate as groups grow; on this CPU its wall time per candidate is higher because fewer, "
            "longer sequences batch less well than many short SQM prompts.",
        ))
    ensemble = load("ensemble")
    if ensemble:
        columns = ["n", "method", "ranking_accuracy", "ci95", "prompts_per_group", "prompt_tokens", "completion_tokens"]
        sections.append(section(
            "6. Large groups and position-bias ensembles", ".venv/bin/python -m bench.ensemble",
            "Large groups:\n\n" + table(ensemble["large_groups"], columns)
            + "\n\nBy per-prompt scale shift (n = 32):\n\n" + table(ensemble["large_groups_by_prompt_shift"], columns)
            + "\n\nPosition bias (n = 8):\n\n" + table(ensemble["position_bias"], columns + ["position_gap"]),
            None,
            f"{ensemble['label']}: {ensemble['note']}",
        ))
    repair = load("repair")
    if repair:
        sections.append(section(
            "7. Verdict repair vs resampling", ".venv/bin/python -m bench.repair",
            table(repair, ["method", "group_size", "groups", "parsed_share", "generations_per_group",
                           "recovery_completion_tokens_per_failure", "prompt_tokens_computed_per_group"]),
            "repair",
            "Real vLLM-CPU on the random-weight model, whose free answers never parse. Repair pays the prompt "
            "tokens of re-reading the analysis (not in the prefix cache) but generates only the verdict.",
        ))
    soak = load("soak")
    sections.append(section(
        "8. Soak (not in CI)", ".venv/bin/python -m bench.soak --minutes 10",
        table([soak["summary"]], list(soak["summary"])) if soak else "Not run yet on this machine.",
        "soak" if soak else None,
        "Mixed load for 10 minutes on 2 replicas (scripted engine): HTTP groups, handle members, bad requests.",
    ))
    from bench.verl_trainer import COLUMNS as VERL_COLUMNS
    from bench.verl_trainer import GROWTH_COLUMNS, phase_growth, zero_cost_row

    def zero_cost_sync_step(runs: list[dict] | None) -> str:
        return fmt((zero_cost_row(runs or [], "sync") or {}).get("step_s"))

    for name in ("verl_trainer", "verl_trainer_offpolicy", "verl_trainer_half"):
        runs = load(name)
        if not runs:
            continue
        info = meta(name)
        settings = info.get("settings", {})
        calibration = fmt(info.get("calibration_gen_s"))
        if name == "verl_trainer":
            title = "9. verl's real trainer, every trainer mode: step time and exposed reward against the limit"
            command = ".venv/bin/python -m bench.verl_trainer"
            note = (
                f"Real verl 0.9.1 trainings (GRPO, {settings.get('prompts', '?')} prompts x {settings.get('n', '?')} "
                f"rollouts of up to {settings.get('max_response_length', '?')} tokens, tiny random policy on vLLM-CPU, "
                "FSDP2 actor) in each trainer mode through the CPU harness, the bridge as reward manager, the real Serve "
                "application (2 replicas). SIMULATED reward cost: the scripted engine spends a fixed time per group, one "
                "group at a time per replica, so that a batch's scoring takes `reward_cost` x the zero-cost sync run's "
                f"generation time per step ({calibration} s). `after_batch` is verl 0.9.1's only "
                "after-batch path for a group reward (its colocated reward loop, legacy trainer). Medians over the logged "
                "steps after the first (vLLM warm-up), from verl's own metrics: `timing_s/step`, and the bridge's "
                "`grrm/exposed_reward_s`, `grrm/limit_s`, `grrm/exposed_vs_limit` (docs/exposure.md). Ratios within one "
                "run. 2 cores distort: the trainer, the policy's vLLM server(s), the reward path and Ray share them, so "
                "generation never truly overlaps training; separate_async, one_step_off and fully_async run a second "
                "policy vLLM server on the same cores. fully_async logs each step's training metrics one step late."
                + f" This run: `--modes {settings.get('modes', '?')} --costs {settings.get('costs', '?')} "
                f"--steps {settings.get('steps', '?')}`."
            )
        else:
            command = (f".venv/bin/python -m bench.verl_trainer --modes {settings.get('modes', '?')} --costs "
                       f"{settings.get('costs', '?')} --steps {settings.get('steps', '?')} --name {name}")
        if name == "verl_trainer_half":
            title = "9c. verl's real trainer at reward = 0.5 x generation, every mode, and where the step time goes"
            note = HALF_COST_NOTE.format(calibration=calibration, main_sync=zero_cost_sync_step(load("verl_trainer")),
                                         this_sync=zero_cost_sync_step(runs))
        elif name == "verl_trainer_offpolicy":
            title = "9b. verl's real trainer, the off-policy modes one_step_off and fully_async"
            note = (
                "A run of its own, set up as section 9 (the same SIMULATED reward cost model), calibrated on its own "
                f"zero-cost sync run ({calibration} s of generation per step): ratios within this "
                "run only. Both modes run a second policy vLLM server (the rollouter) beside the trainer's on the same "
                "2 cores. fully_async logs each step's training metrics one step late."
            )
        body = table(runs, VERL_COLUMNS)
        growth = phase_growth(runs)
        if growth:
            body += "\n\nWhere the step time went (seconds over the mode's zero-cost run, medians):\n\n" + table(
                growth, GROWTH_COLUMNS)
        sections.append(section(title, command, body, name, note + f"\n\nPlot: {plot_link(name)}."))
    chaos = load("chaos")
    if chaos:
        sections.append(section(
            "10. Chaos: engine death, replica death, dangling members, bad inputs",
            ".venv/bin/python -m bench.chaos",
            table(chaos["phases"], ["phase", "members_sent", "members_valid", "members_lost", "groups_duplicated",
                                    "split_groups", "in_flight_at_fault", "recovery_s", "replicas_back_s",
                                    "max_latency_s", "rss_mib_before", "rss_mib_after"])
            + "\n\nDangling flood: " + ", ".join(
                f"{row['dangling_members']} dangling members, answered "
                + ", ".join(f"{count} {answer}" for answer, count in row["dangling_answered"].items())
                + f" (2 assembly timeouts: the client re-sends a timed-out member once) after at most "
                f"{fmt(row['dangling_max_wait_s'])} s, replica processes {fmt(row['replica_rss_mib_before'])} -> "
                f"{fmt(row['replica_rss_mib_after'])} MiB"
                for row in chaos["phases"] if row["phase"] == "dangling_flood")
            + "\n\nBad inputs, as answered when this was run:\n\n"
            + table(chaos["bad_inputs"], ["input", "expected", "status", "answer"])
            + hang_rerun(),
            "chaos",
            "Real vLLM-CPU, deployments/local.yaml's app (2 replicas; assembly timeout 10 s so dangling members "
            "time out within the run). Members streamed group by group, half over HTTP, half over the handle. "
            "`recovery_s`: from the fault until every member in flight at that moment was answered; "
            "`replicas_back_s`: until 2 replicas answered again. `groups_duplicated` counts scorings beyond one "
            "per group (live replicas' counters plus the dead replica's answers). RSS: all the app's processes "
            "and their children (engine cores included).",
        ))
    engines = load("engines")
    if engines:
        targets = engines["targets"]
        sections.append(section(
            "11. Engines against their libraries' plain batch calls", ".venv/bin/python -m bench.engines",
            f"Targets at batch {targets['batch']}, fresh shapes, no constraint: engine / plain `generate` tokens/s "
            f"{', '.join(f'{k} {fmt(v)}' for k, v in targets['engine_vs_plain'].items())} (>= 0.7: "
            f"{'met' if targets['engine_vs_plain_met'] else 'NOT met'}); engine bf16 / fp32 "
            f"{', '.join(f'{k} {fmt(v)}' for k, v in targets['bf16_vs_fp32_fresh'].items())} (>= 1: "
            f"{'met' if targets['bf16_no_slower_met'] else 'NOT met'}).\n\n"
            + table(engine_pairs(engines["rows"]), ["engine", "dtype", "mode", "constraint", "batch", "shapes",
                                                    "tokens", "plain_tokens_per_s", "engine_tokens_per_s",
                                                    "engine_vs_plain"]),
            "engines",
            f"Device: {engines['device']}; model: {engines['model']}; {engines['answer_tokens']} answer tokens (fixed "
            "without a constraint; with the GQM verdict regex, rows end when the verdict is complete; `tokens`: the "
            "engine's). `engine`: the project's engine; `plain`: the library's own batch call on the same prompts "
            "(transformers: one `model.generate`, xgrammar's HF processor for the regex; vLLM: offline "
            "`LLM.generate`, each side in its own process). Every measured batch has prompts of new lengths (new "
            "padded shapes); `repeated` re-runs one batch. 3 batches per row and side; transformers sides "
            "alternate batch by batch.",
        ))
    score_cli = load("score_cli")
    if score_cli:
        sections.append(section(
            "12. `grrm score` vs the bare HTTP API", ".venv/bin/python -m bench.score_cli",
            table(score_cli, ["path", "concurrency", "groups", "runs", "wall_s", "groups_per_s", "vs_bare_http"]),
            "score_cli",
            "The same groups at the same concurrency (groups in flight) on a local Serve app (2 replicas, scripted "
            "`realistic` engine: simulated, so the figures measure the command, not a model). `bare_http`: an httpx "
            "client posting one group per request from memory. `grrm_score_url` / `_app`: the whole command in "
            "process (parquet read, row checks, journal, parts, merge, summary) over HTTP / through a Serve handle. "
            "`grrm_score_ray`: Ray Data reads, 2 actors call the handle (half the concurrency each), Ray Data writes; "
            "its start-up (actor pool, read and write tasks) is in the time. `_app` and `_ray` call the replicas "
            "through a handle, skipping the HTTP proxy and ingress: faster than any HTTP client here. Means over "
            "interleaved runs.",
        ))
    tensor_parallel = load("tensor_parallel")
    if tensor_parallel:
        from bench.tensor_parallel import COLUMNS as TP_COLUMNS

        sections.append(section(
            "13. Tensor parallelism: a TP = 2 replica against TP = 1",
            ".venv/bin/python -m bench.tensor_parallel",
            table(tensor_parallel, TP_COLUMNS),
            "tensor_parallel",
            "Real vLLM-CPU, deployments/local.yaml's app with one replica, the tiny random-weight model. TP = 2 runs "
            "its ranks as processes of the replica (vLLM's `mp` executor, deployments/placement.py). `start_s`: "
            "`serve.run` to a running app; then groups of 4 over HTTP, 8 in flight, after one warm-up group. Ratios "
            "within one run. On 2 cores TP costs and gains nothing useful: both ranks share the cores that the engine "
            "core, Serve and the client use, and synchronize at every layer; this shows the path works and what it "
            "costs here, not a GPU speed-up.",
        ))
    node_chaos = load("node_chaos")
    if node_chaos:
        from bench.node_chaos import COLUMNS as NODE_COLUMNS

        sections.append(section(
            "14. Node, ingress, ledger, GCS and head faults on a multi-node cluster",
            ".venv/bin/python -m bench.node_chaos --redis",
            table(node_chaos["phases"], NODE_COLUMNS),
            "node_chaos",
            "SIMULATED ENGINE (scripted, 0.3 s per prompt): what is measured is Ray, Serve and the app surviving a "
            "node, not the model. `ray.cluster_utils.Cluster` on one machine: a head with 0 CPUs (Serve controller, "
            "HTTP proxy) and 4 worker nodes of 2 CPUs; 3 scorer, 2 ingress and 2 ledger replicas spread by Serve. "
            "Members streamed through `grrm_client.RewardClient`, half over HTTP, half over the handle. A node "
            "fault kills the node's raylet and every process on it without grace; a fresh node is added after the "
            "stream (as KubeRay would start a pod). `victim_held`: the replicas on the killed node. `recovery_s`: "
            "from the fault until every member then in flight was answered (a dead node is noticed by Ray's "
            "health checks, ~10-15 s); `replicas_back_s`: until 3 scorers, 2 ingress and 2 ledger replicas ran "
            "again (and, after a head fault, the Serve controller ran on the new head). The GCS and head rows run on "
            "a second cluster with GCS fault tolerance on a local redis-server: `gcs_restart` kills the GCS for 5 s; "
            "`head_restart` kills the whole head (GCS, Serve controller, raylet, proxy) without grace and starts a "
            "new head on the same Redis and GCS port 5 s later (as KubeRay restarts the head pod). There the "
            "members stream from a detached actor on a worker node, over that node's own Serve proxy "
            "(`RAY_SERVE_WORKER_PROXY_HTTP_PORT`: each worker proxy binds its own port on one machine) and a handle, "
            "by a client made before the first phase; `gcs_restart` kills the GCS 0.8 s into the stream of a fresh "
            "app, while at least one scorer replica has had no member yet (every Serve handle of the app sets its "
            "router up when built: Ray 2.60 reads the GCS at a handle's first call); "
            "`scorers_answering_while_down`: the scorer replicas that answered while it was down (which own "
            "the groups of a short stream is the ring's chance); `groups_due_while_down`: groups all of whose "
            "members were sent 3 s or more before it was back (or as long as the slowest group answered whole "
            "while it was down took, where longer: `outage_margin_s`), `groups_waiting_for_the_outage`: those "
            "of them answered only after it was back (a frozen replica, router or proxy; 0 expected); "
            "`answered_while_down`: answers that arrived while the GCS or the head was down; `scorers_replaced`: "
            "scorer replicas gone after the phase (0: no model reload); `app_status_after`: the app's status from "
            "the restarted controller. The node rows run without GCS fault tolerance: with the app running, a worker "
            "node killed on a cluster with it was once not declared dead within 5 minutes here (a bare cluster "
            "declared one dead in 17 s; not understood).",
        ))
    fair_share = load("fair_share")
    if fair_share:
        floods = [row for row in fair_share if row["case"] in ("engine_bound", "http_bound")]
        shares = [row for row in fair_share if row["case"] == "weights"]
        alone = [row for row in fair_share if row["case"] == "alone"]
        verl = [row for row in fair_share if row["case"] == "verl"]
        sections.append(section(
            "15. Many tenants on one pool: fair share against first come first served",
            ".venv/bin/python -m bench.fair_share",
            table(floods, ["case", "mode", "small_groups", "flood_groups", "small_alone_s", "small_beside_flood_s",
                           "beside_over_alone", "flood_groups_per_s"])
            + "\n\n" + table(shares, ["tenant", "weight", "groups_while_all_busy", "share", "weighted_share",
                                       "share_over_weighted_share"])
            + "\n\n" + table(alone, ["mode", "groups", "rounds", "groups_per_s", "throughput_over_fifo"])
            + ("\n\n" + table(verl, FAIR_SHARE_VERL_COLUMNS) if verl else "")
            + "\n\nPlot: " + plot_link("fair_share") + ".",
            "fair_share",
            "SIMULATED engine (scripted: a fixed time per group, a bounded number of generations at once per "
            "replica), real Ray Serve and HTTP, every request through `grrm_client` under its tenant; each case runs "
            "with `tenants.fair_share` off (`fifo`) and on (`fair`) in the same run. Flood: a small run's groups "
            "(4 members each, one HTTP request per member, as the trainer bridge sends them) alone, then 3 s after "
            "another tenant sent 20x (engine-bound: 0.4 s per group, one at a time, 2 replicas) or 25x "
            "(HTTP-bound: 0.1 s, two at a time) their work; `beside_over_alone`: the small run's last reward, "
            "beside the flood / alone. `fair+flood_limit_8`: the flood also held to 8 groups in flight per "
            "replica (`max_groups_in_flight`; its excess answered 503 and retried by its client); "
            "`fair+flood_client_32`: the flood's client sends at most 32 groups at once. Weights: three "
            "backlogged tenants on one replica; shares of the groups finished while all three had work. Alone: one "
            "tenant, 240 whole groups, 4 generations at once per replica, median of rounds alternating the modes. "
            "verl: its real sync trainer on the CPU harness (8 prompts x 4 rollouts, the bridge over the handle; "
            "service: 2 replicas, 0.3 s per group, 2 at once each) alone, then while `grrm score --concurrency 32` "
            "floods the same service as tenant `nightly-eval` at priority -1; `reward_wait_s`: the median over the "
            "steps after the first of `grrm/exposed_reward_s` (last reward after the last rollout); "
            "`fair+reserve_1`: `tenants.reserved_slots: 1`; `flood_recent_share`: the flood's share of the tokens "
            "served in the last minute, read at the end of the run. The step time grows beside the flood because "
            "its HTTP path and `grrm score` take CPU from the trainer's generation on these 2 cores. "
            "`not_valid_by_reason`: the bridge's counts of the rewards that were not valid, by its metric "
            "(`grrm/default/invalid_text`: the rollout's own text could not be scored, a default reward by design; "
            "`grrm/failed`: the service did not answer). The earlier run's 127/128 rows recorded only the count.",
        ))
    hostile = load("hostile_tenants")
    if hostile:
        sections.append(section(
            "15b. A careless or hostile tenant: what it costs the others and the service",
            ".venv/bin/python -m bench.hostile_tenants",
            table([row for row in hostile if row["case"] == "stall"], STALL_COLUMNS)
            + "\n\n" + table([row for row in hostile if row["case"] == "announcements"], ANNOUNCEMENT_COLUMNS)
            + "\n\n" + table([row for row in hostile if row["case"] == "refusals"], REFUSAL_COLUMNS),
            "hostile_tenants",
            "SIMULATED engine (scripted, 0.05 s per group), real Ray Serve and HTTP. Stall: 1,100 members of tenant "
            "beta, one of each group of 8 (a trainer with the wrong group_size: they never complete), sent at once "
            "over raw HTTP without retries and given up at 180 s (OpenRLHF's client limit), on 2 replicas of 256 "
            "request slots (assembly timeout 60 s); `fifo`: first come first served and no bound on a tenant's "
            "waiting members (as before the bound), `defaults`: the fair queue and `max_waiting_members` unset "
            "(half a replica's slots). Tenant alpha's `/v1/score` of one group: `alpha_solo_s` the median of 5 "
            "alone, `alpha_first_s` one sent 2 s into the flood (behind its 1,100 requests in the HTTP path of "
            "these 2 cores, whatever the bound), `alpha_beside_s` the slowest of 5 sent once the flood's refusals "
            "were answered. `flood_refused`: 503 `overloaded`; `flood_timed_out`: 504 at the assembly timeout; "
            "`flood_unanswered`: no answer within 180 s. Announcements: 500 tenant names announce 64-slice "
            "profiles (`before`: none yet), then withdraw; `info_s` the slowest of 3 `GET /v1/info`; `report_keys` "
            "what the ingress reports to the autoscaling policy, `report_keys_per_tenant_format` what the format "
            "before the bound would have held (4 + 64 keys per announcing tenant, computed); the controller's CPU "
            "share over 10 s and its resident memory. Refusals: 30 uploads of 60 MB, 5 at a time, with httpx: "
            "unauthenticated (a 401 after at most 64 KiB of the body, then the connection closed: `closed_early` "
            "counts the clients that saw the close before the answer), and with the token but over "
            "`limits.max_request_bytes` (a 413 after the body is read and dropped, up to `limits.max_discard_bytes`, "
            "64 MiB); growth of the resident memory of Serve's proxy and the ingress, measured 5 s after each "
            "series, both started with `MALLOC_MMAP_THRESHOLD_=131072` (deployments/process_env.py, as `grrm serve` "
            "and the Kubernetes pods start them; with glibc's default the same 401 series left them 360 MiB larger "
            "in a run of this benchmark, and 20 such uploads took about 1.7 GB before a 401 read only 64 KiB).",
        ))
    sections.extend(own_sections())
    return relative_paths("\n".join(sections))


def main() -> int:
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

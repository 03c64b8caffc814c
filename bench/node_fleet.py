"""The node fleet: `grrm check deployments/grrm.yaml` on every GPU node state simulated/node_fleet.py builds
(SIMULATED nodes: a stand-in nvidia-smi, the GPU build's package metadata, model directories and hub caches,
/dev/shm's size), each judged against the verdict it owes. A table (state, verdict, fix line) and
``bench/results/node_fleet.json``; exit status 1 when a state is judged wrong.

    .venv/bin/python -m bench.node_fleet            # every state as the user runs it: the console script
    .venv/bin/python -m bench.node_fleet --quick    # through the CLI's main() in this process (CI)
"""

from __future__ import annotations

import argparse
import time

from bench.common import machine, print_table, write_json
from simulated.node_fleet import CASES, run_case, world_root

COMMAND = ".venv/bin/python -m bench.node_fleet"


def report_section(results: list[dict]) -> str:
    """docs/benchmarks.md's section: the fleet table (results: node_fleet.json's rows)."""
    lines = ["| state | verdict | fix |", "|---|---|---|"]
    lines += [f"| {row['state']} | {row['verdict']}{'' if row['as_expected'] else ' (WRONG: expected ' + row['expected'] + ')'} "
              f"| {row['fix'].replace('|', '/')} |" for row in results]
    judged = sum(row["as_expected"] for row in results)
    return "\n".join([
        "## The node fleet: `grrm check` on simulated GPU nodes",
        "",
        f"Command: `{COMMAND}`",
        "",
        "SIMULATED NODES, real checks: each state is laid out on this CPU machine from stand-ins (an `nvidia-smi` "
        "answering from a case file, the image's GPU build as package metadata, Qwen2.5-7B's config and a "
        "safetensors index with placeholder shards in a local directory or a hub cache, `/dev/shm`'s free bytes) "
        "and judged by the installed `grrm check` on `deployments/grrm.yaml` (a copy with the engine block "
        "changed where the state is about it). `verdict`: the checks that are problems; `fix`: what each one "
        "tells the user (`<node>`: the state's directory). What stands in for what: `simulated/node_fleet.py`; "
        "the checks and the driver floor: `docs/operations/node-checks.md`.",
        f"{judged} of {len(results)} states judged as they should be.",
        "",
        "\n".join(lines),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="run grrm check's main() in this process (a read-only cache still in a process of its own)")
    parser.add_argument("--only", default="", metavar="NAMES", help="comma-separated states (default: all)")
    args = parser.parse_args(argv)
    chosen = [case for case in CASES if not args.only or case.name in args.only.split(",")]
    started = time.monotonic()
    with world_root() as root:
        results = [run_case(case, root, in_process=args.quick) for case in chosen]
    wall_s = time.monotonic() - started
    rows = [result.row() for result in results]
    print_table(rows, ["state", "verdict", "fix"])
    write_json("node_fleet", rows, {"machine": machine(), "quick": args.quick, "wall_s": wall_s,
                                    "command": COMMAND + (" --quick" if args.quick else "")})
    wrong = [result for result in results if result.mismatches()]
    for result in wrong:
        print(f"\n{result.case.name} judged wrong: {'; '.join(result.mismatches())}\n{result.output}")
    print(f"{len(rows) - len(wrong)} of {len(rows)} states judged as they should be ({wall_s:.1f} s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())

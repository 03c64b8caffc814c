"""``grrm score --ray``: the same scoring with Ray Data, for datasets one machine cannot drive.

Ray Data reads the input (``read_parquet`` / ``read_json``), a pool of actors scores each batch
by calling the application's Serve handle (the same :class:`~grrm_cli.scorers.ServiceScoring`
as ``--app``, so retries and backoff are grrm_client's), and Ray Data writes the output folder
(``write_parquet`` / ``write_json``). Reading, scoring and writing run on every node of the
cluster. Columns, bad rows and renamed input columns are as without ``--ray``
(:mod:`grrm_cli.columns`), but for the recipe's part columns: each output file has those its batch's
answers carried.

Not resumable: Ray Data retries failed tasks itself, and a failed run is run again from the start
(``--overwrite``). Ray Data's readers need one type per column (a JSON Lines row whose value has
another type than the rows before it stops the read); the local path turns such rows into bad rows.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from cluster.protocol.schema import DEFAULT_TENANT
from grrm_cli import columns as cols
from grrm_cli.dataset import COMPONENT_TYPE, RESULT_TYPES, component_columns
from grrm_cli.progress import Summary
from grrm_cli.scorers import ScoringStopped, ServiceScoring, SetupError, connect_ray
from grrm_client.config import ClientConfig


class ScoreBatches:
    """A Ray Data actor: scores the groups of each batch it gets, ``concurrency`` at a time."""

    def __init__(self, mapping: cols.ColumnMapping, client: ClientConfig, concurrency: int):
        self.mapping = mapping
        self.scoring = ServiceScoring(client)
        self.concurrency = concurrency

    async def __call__(self, table: pa.Table) -> pa.Table:
        slots = asyncio.Semaphore(self.concurrency)

        async def score(values: dict[str, Any]) -> dict[str, Any]:
            group, problem = cols.to_group(values, self.mapping)
            if group is None:
                return cols.bad_row_fields(problem or "not a group")
            async with slots:
                return await self.scoring.score(group)

        fields = await asyncio.gather(*(score(values) for values in table.to_pylist()))
        output = table.rename_columns([cols.kept_name(name) for name in table.column_names])
        columns = {**RESULT_TYPES, **dict.fromkeys(component_columns([name for f in fields for name in f]),
                                                   COMPONENT_TYPE)}
        for name, arrow_type in columns.items():
            output = output.append_column(pa.field(name, arrow_type),
                                          pa.array([f.get(name) for f in fields], type=arrow_type))
        return output


def score_with_ray_data(
    job: Any, *, app_name: str, address: str | None, workers: int, max_attempts: int, deadline_s: float,
    tenant: str = DEFAULT_TENANT,
) -> Summary:
    """Score ``job.input`` into the folder ``job.output`` on the Ray cluster; returns the summary."""
    started = time.monotonic()
    output = Path(job.output)
    if output.exists() and not job.overwrite:
        raise SetupError(f"-o: {output} exists; pass --overwrite to replace it (--ray runs are not resumable)")
    client = ClientConfig(transport="handle", app_name=app_name, max_attempts=max_attempts, deadline_s=deadline_s,
                          tenant=tenant)
    connect_ray(address)
    described = asyncio.run(ServiceScoring(client).start())  # the application exists: one clear error if not

    import ray.data
    from ray.data import SaveMode

    source = str(job.input)
    dataset = ray.data.read_parquet(source) if job.input_format == "parquet" else ray.data.read_json(source, lines=True)
    present = list(dataset.schema().names)
    cols.check_columns(present, job.mapping, source)
    scored = dataset.map_batches(
        ScoreBatches,
        fn_constructor_kwargs={"mapping": job.mapping, "client": client, "concurrency": job.concurrency},
        batch_format="pyarrow",
        batch_size=job.batch_rows,
        concurrency=workers,
        num_cpus=0.25,  # the actors wait on the service; they need little CPU of their own
    )
    mode = SaveMode.OVERWRITE if job.overwrite else SaveMode.APPEND
    try:
        if job.output_format == "parquet":
            scored.write_parquet(str(output), mode=mode)
        else:
            scored.write_json(str(output), mode=mode)
    except Exception as error:  # noqa: BLE001 - Ray wraps the actor's exception; name the cause
        cause = _root_cause(error)
        if isinstance(cause, ScoringStopped):
            raise ScoringStopped(f"{cause} (a --ray run is not resumable: rerun it with --overwrite)") from None
        raise
    summary = Summary.of_output(
        output, job.output_format, seconds=time.monotonic() - started, scorer=f"{described} via Ray Data",
        renamed=cols.renamed_columns(present),
    )
    summary.scored_now = summary.groups  # every row was scored by this run
    return summary


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception Ray wrapped (``RayTaskError`` chains, ``UserCodeException``)."""
    seen = error
    while True:
        inner = getattr(seen, "cause", None) or seen.__cause__
        if inner is None or inner is seen:
            return seen
        seen = inner

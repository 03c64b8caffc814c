"""Verdict repair on the real CPU vLLM engine: a random-weight model never
writes a parseable verdict on its own; the regex-constrained continuation of its analysis
(vLLM structured outputs) always yields one, for every group size and model-written prompt type."""

from __future__ import annotations

import pytest
import pytest_asyncio

from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, make_engine
from cluster.protocol.schema import GroupRequest
from cluster.scorer import GroupScorer

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_model_dir):
    engine = make_engine(EngineConfig(kind="vllm", model=str(tiny_model_dir), dtype="float32", max_model_len=4096,
                                      max_num_batched_tokens=8192, engine_kwargs={"enforce_eager": True}))
    await engine.start()
    yield engine
    await engine.stop()


def group(size: int, i: int = 0) -> GroupRequest:
    return GroupRequest(group_id=f"r{size}-{i}", source=f"The meeting was postponed until further notice ({i}).",
                        candidates=[f"Die Sitzung wurde vertagt, Variante {k}." for k in range(size)],
                        src_lang="en", trg_lang="de")


@pytest.mark.parametrize("prompt_type", ["ranking_score", "score"])
async def test_repaired_verdicts_always_parse(engine, prompt_type):
    repairing = GroupScorer(engine, ScoringConfig(prompt_type=prompt_type, retries=0, verdict_repair=True,
                                                  max_answer_tokens=48, max_group_size=8))
    results = await repairing.score_groups([group(size, i) for size in (2, 3, 5, 8) for i in range(2)])
    for result in results:
        assert result.valid, (result.failure, result.error, result.answer)
        assert result.repairs == 1 and result.attempts == 1
        assert all(0 <= score <= 10 for score in result.scores)


async def test_without_repair_the_random_model_does_not_parse(engine):
    # The control: what repair saves. Free generation from random weights gives no verdict.
    plain = GroupScorer(engine, ScoringConfig(retries=1, verdict_repair=False, max_answer_tokens=48))
    results = await plain.score_groups([group(4, i) for i in range(3)])
    assert not any(result.valid for result in results)
    assert all(result.failure == "parse_failed" and result.attempts == 2 for result in results)


async def test_bench_repair_quick_repair_recovers_every_failure_for_fewer_tokens_than_resampling(engine):
    """bench.repair --quick's comparison, on this module's engine: repair parses every group after
    one failed answer, resampling (one retry) parses none, and repair spends fewer recovery tokens."""
    from bench.repair import compare, parse_args

    rows = {row["method"]: row for row in await compare(engine, parse_args(["--quick"]))}
    assert set(rows) == {"repair", "resample"}
    repair, resample = rows["repair"], rows["resample"]
    assert repair["groups"] == resample["groups"] == 2
    assert repair["parsed_share"] == 1.0 and resample["parsed_share"] == 0.0, rows
    assert repair["generations_per_group"] == 2.0 and resample["generations_per_group"] == 2.0, rows
    assert 0 < repair["recovery_completion_tokens_per_failure"] < resample["recovery_completion_tokens_per_failure"]

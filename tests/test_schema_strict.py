"""Request models take no coerced input: every field refuses a value of the wrong type,
from Python (handle callers) and from JSON (what FastAPI reads), and the error names the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from cluster.protocol.schema import DemandAnnouncement, GroupRequest, MemberRequest
from deployments.http.models import ScoreRequest

MEMBER = {"group_id": "g", "group_size": 4, "index": 1, "source": "Quelle.", "candidate": "Source.",
          "src_lang": "de", "trg_lang": "en", "invalid": False}
GROUP = {"group_id": "g", "source": "Quelle.", "candidates": ["a", "b"], "src_lang": "de", "trg_lang": "en"}

# Every request field that is not a text, with values a lax parser would coerce into it.
COERCIBLE = {
    "int": [True, False, "3", "0", 2.0, 0.0, 3.5, np.int64(2), None],
    "bool": ["true", "false", 1, 0, 1.0, "1", np.bool_(True), None],
    "str": [3, 2.5, True, b"bytes", None],
    "optional str": [3, 2.5, True, b"bytes"],
    "optional float": [True, "3.5", "1700000000"],
}
MEMBER_FIELDS = {"group_size": "int", "index": "int", "invalid": "bool", "group_id": "str", "source": "str",
                 "candidate": "str", "src_lang": "str", "trg_lang": "str", "member_id": "optional str",
                 "sent_at": "optional float"}
GROUP_FIELDS = {"source": "str", "src_lang": "str", "trg_lang": "str"}


def cases(model, base, fields):
    return [pytest.param(model, base, field, value, id=f"{model.__name__}.{field}={value!r}")
            for field, kind in fields.items() for value in COERCIBLE[kind]]


def named_fields(error: ValidationError) -> set[str]:
    """The fields an error names: by location, or (a rule across fields) at the start of its message."""
    return {str(item["loc"][0]) if item["loc"] else item["msg"].removeprefix("Value error, ").split(":")[0]
            for item in error.errors()}


def refuses(model, body: dict, field: str) -> None:
    """``model`` refuses ``body`` from Python and, where JSON can carry the value, from JSON; naming ``field``."""
    with pytest.raises(ValidationError) as python_error:
        model.model_validate(body)
    assert field in named_fields(python_error.value)
    try:
        text = json.dumps(body)
    except TypeError:  # numpy scalars and bytes exist only on the Python path
        return
    with pytest.raises(ValidationError) as json_error:
        model.model_validate_json(text)
    assert field in named_fields(json_error.value)


@pytest.mark.parametrize(("model", "base", "field", "value"),
                         cases(MemberRequest, MEMBER, MEMBER_FIELDS) + cases(GroupRequest, GROUP, GROUP_FIELDS))
def test_a_coercible_value_is_refused_naming_its_field(model, base, field, value):
    refuses(model, {**base, field: value}, field)


@pytest.mark.parametrize("value", [7, True, b"x", None])
def test_candidates_must_be_strings(value):
    with pytest.raises(ValidationError) as error:
        GroupRequest.model_validate({**GROUP, "candidates": ["a", value]})
    assert error.value.errors()[0]["loc"] == ("candidates", 1)


@pytest.mark.parametrize("value", [3, "g", True])
def test_group_id_of_a_group_is_a_string_or_absent(value):
    body = {**GROUP, "group_id": value}
    if isinstance(value, str):
        assert GroupRequest.model_validate(body).group_id == value
    else:
        refuses(GroupRequest, body, "group_id")
    assert GroupRequest.model_validate({k: v for k, v in GROUP.items() if k != "group_id"}).group_id is None


def test_exact_types_are_accepted_from_python_and_json():
    member = MemberRequest.model_validate(MEMBER)
    assert (member.group_size, member.index, member.invalid) == (4, 1, False)
    assert MemberRequest.model_validate_json(json.dumps({**MEMBER, "invalid": True, "candidate": ""})).invalid is True
    # Text subclasses (numpy's str_, what verl rows hold) are strings; a tuple of texts is a list.
    group = GroupRequest(**{**GROUP, "source": np.str_("Quelle."), "candidates": ("a", np.str_("b"))})
    assert group.candidates == ["a", "b"] and group.source == "Quelle."


def test_the_http_batch_refuses_coercion_inside_its_groups():
    with pytest.raises(ValidationError) as error:
        ScoreRequest.model_validate_json(json.dumps({"groups": [{**GROUP, "src_lang": 1}]}))
    assert error.value.errors()[0]["loc"] == ("groups", 0, "src_lang")


@pytest.mark.parametrize("profile", [[-0.1, 1.0], [0.0, 0.0], [float("nan")], [1.0] * 65])
def test_a_demand_profile_that_is_no_share_is_refused_naming_the_field(profile):
    with pytest.raises(ValidationError) as refused:
        DemandAnnouncement(groups=8, lasts_s=30, profile=profile)
    assert named_fields(refused.value) == {"profile"}, refused.value
    assert DemandAnnouncement(groups=8, lasts_s=30, profile=[0.0, 0.2, 0.8]).profile == [0.0, 0.2, 0.8]

"""The node-fault bench's outage check (``bench.node_chaos.outage_waits``): a group that had time to be
scored while the GCS was down and was answered only after it came back waited for it."""

from __future__ import annotations

from bench.node_chaos import outage_waits

DOWN_AT, BACK_AT = 10.0, 15.0  # the GCS is down from 10 s to 15 s


def group(group_id: str, sent: list[float], answered: list[float]) -> list[dict]:
    return [{"group_id": group_id, "sent_at": s, "answered_at": a} for s, a in zip(sent, answered, strict=True)]


def test_a_group_sent_in_time_and_answered_only_after_the_outage_waited_for_it():
    answers = [
        *group("before", [8.0, 8.2], [8.5, 8.5]),  # scored before the fault: not due
        *group("in_flight", [9.8, 9.9], [10.4, 10.4]),  # in flight at the fault, answered while down
        *group("scored_while_down", [10.5, 11.0], [11.3, 11.3]),
        *group("frozen", [10.6, 11.2], [15.2, 15.2]),  # sent in time, answered only once the GCS was back
        *group("late", [13.0, 14.0], [15.5, 15.5]),  # sent too close to the end to count
    ]
    assert outage_waits(answers, DOWN_AT, BACK_AT, margin_s=3.0) == {
        "groups_due_while_down": 3, "groups_waiting_for_the_outage": 1,
    }


def test_one_member_answered_while_down_means_its_group_did_not_wait():
    answers = group("g", [10.5, 11.0], [11.4, 15.1])  # the second answer went out after the GCS was back
    assert outage_waits(answers, DOWN_AT, BACK_AT, margin_s=3.0)["groups_waiting_for_the_outage"] == 0

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
        "groups_due_while_down": 3, "groups_waiting_for_the_outage": 1, "outage_margin_s": 3.0,
    }


def test_one_member_answered_while_down_means_its_group_did_not_wait():
    answers = group("g", [10.5, 11.0], [11.4, 15.1])  # the second answer went out after the GCS was back
    assert outage_waits(answers, DOWN_AT, BACK_AT, margin_s=3.0)["groups_waiting_for_the_outage"] == 0


def test_on_a_slow_machine_the_margin_is_the_slowest_group_the_outage_did_not_hold():
    # Down 10 s here; every group the outage did not hold took 6 s, as on a saturated CI machine.
    down_at, back_at = 10.0, 20.0
    answers = [
        *group("slow_while_down", [10.5, 11.0], [16.5, 17.0]),  # answered whole while down: 6 s
        *group("slow_after", [13.5, 14.5], [20.2, 20.3]),  # last sent 5.5 s before the end: not due
        *group("frozen", [10.2, 10.5], [20.1, 20.1]),  # sent 9.5 s before the end, held to it
        # 8.9 s, slower than any group answered while down, sent 7.5 s before the end: not due (a 6 s
        # margin counted it as held).
        *group("slow_at_the_end", [11.5, 12.5], [21.4, 21.4]),
    ]
    assert outage_waits(answers, down_at, back_at, margin_s=3.0) == {
        "groups_due_while_down": 2, "groups_waiting_for_the_outage": 1, "outage_margin_s": 1.5 * 6.0,
    }
    # With nothing answered while down (everything froze), the margin stays the floor.
    frozen = group("frozen", [11.2, 11.5], [20.1, 20.1])
    assert outage_waits(frozen, down_at, back_at, margin_s=3.0)["outage_margin_s"] == 3.0

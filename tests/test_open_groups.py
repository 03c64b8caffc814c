"""Which group a member of a keyed group without ids joins (cluster/open_groups.py), in milliseconds."""

from __future__ import annotations

import itertools

import pytest

from cluster.open_groups import GROUP_SEPARATOR, OpenGroups


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def groups(ttl_s: float = 60.0) -> tuple[OpenGroups, Clock]:
    clock = Clock()
    counter = itertools.count()
    return OpenGroups(ttl_s, clock=clock, token=lambda: f"t{next(counter)}"), clock


def test_members_of_a_key_form_groups_of_their_size_in_arrival_order():
    open_groups, _ = groups()
    assigned = [open_groups.group_of("k", 3, f"m{i}") for i in range(7)]
    assert assigned == ["k~t0"] * 3 + ["k~t1"] * 3 + ["k~t2"]
    assert GROUP_SEPARATOR == "~"
    # Another key fills groups of its own, interleaved or not.
    assert open_groups.group_of("other", 3, "m0") == "other~t3"
    assert open_groups.group_of("k", 3, "m7") == "k~t2"


def test_a_member_sent_again_gets_the_group_it_joined_first():
    open_groups, clock = groups()
    first = [open_groups.group_of("k", 2, member) for member in ("a", "b", "c")]
    clock.now = 30
    assert [open_groups.group_of("k", 2, member) for member in ("b", "a", "c")] == [first[1], first[0], first[2]]
    # A retry does not count twice: "c"'s group still takes one more member.
    assert open_groups.group_of("k", 2, "d") == first[2]
    assert open_groups.members() == 4


def test_a_changed_size_starts_a_new_group():
    open_groups, _ = groups()
    assert open_groups.group_of("k", 4, "a") == "k~t0"
    assert open_groups.group_of("k", 2, "b") == "k~t1"


def test_members_unseen_for_ttl_are_forgotten_and_their_filling_group_closes():
    open_groups, clock = groups(ttl_s=10)
    assert open_groups.group_of("k", 4, "a") == "k~t0"
    clock.now = 5
    assert open_groups.group_of("k", 4, "b") == "k~t0"
    clock.now = 12  # "a" expires; "b" keeps the group open
    assert open_groups.group_of("k", 4, "c") == "k~t0" and open_groups.members() == 2
    clock.now = 30  # everyone expired: the next member starts a group of its own
    assert open_groups.group_of("k", 4, "d") == "k~t1" and open_groups.members() == 1
    assert open_groups.group_of("k", 4, "a") == "k~t1"  # forgotten: a new member now


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="ttl_s: must be positive"):
        OpenGroups(0)
    with pytest.raises(ValueError, match="size: must be at least 1"):
        OpenGroups(1).group_of("k", 0, "a")

"""The bound on a tenant's members waiting for group-mates (``cluster/admission.py``), derived from what a
replica holds and what the tenant may use: room stays for other tenants and for the members that complete
groups, a hostile tenant holds at most three quarters of a replica's slots, and one tenant's full step waits
without a refusal where the slots are sized for it (GRRM's 512 prompts x 8 on one replica of grrm.yaml).
Checked on the real GroupAssembler (pure asyncio), members in the worst order."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from cluster.admission import TENANT_SLOT_SHARE, slots_for_step, waiting_members_bound
from cluster.assembly import JOIN_HEADROOM, AssemblySettings, GroupAssembler
from cluster.protocol.schema import GroupRequest, GroupResult, MemberRequest
from deployments.config import AppConfig, ReplicaSettings, TenantDefaults, TenantsSettings, load_app_config

GRRM_YAML = Path(__file__).resolve().parents[1] / "deployments" / "grrm.yaml"


def test_the_bound_leaves_a_quarter_of_the_slots_and_never_exceeds_what_the_groups_limit_allows():
    for slots in (4, 40, 256, 2048, 4096, 8192, 10_000):
        bound = waiting_members_bound(slots, largest_group=26)
        # What the tenant's waiting members may hold at most (new groups stop at the bound, joins at 1.5x it).
        held = JOIN_HEADROOM * bound
        assert held <= TENANT_SLOT_SHARE * slots < slots, slots
    assert waiting_members_bound(40, largest_group=26) == 20  # what the hostile-tenant test holds beta to
    assert waiting_members_bound(8192, largest_group=26, max_groups_in_flight=64) == 64 * 25
    assert waiting_members_bound(8192, largest_group=26, max_groups_in_flight=10_000) == 4096
    assert waiting_members_bound(1, largest_group=2) == 1
    with pytest.raises(ValueError, match="slots"):
        waiting_members_bound(0, largest_group=8)
    with pytest.raises(ValueError, match="largest_group"):
        waiting_members_bound(8, largest_group=1)


def test_grrm_yamls_replica_holds_one_tenants_full_step_of_512_prompts_x_8():
    config = load_app_config(GRRM_YAML)
    assert config.waiting_members_limit("any-run") >= 512 * (8 - 1)
    assert config.replicas.max_ongoing_requests >= slots_for_step(512, 8) == 7168
    # Every member of the step (waiting or complete and waiting for the engine) fits the replica's slots.
    assert config.replicas.max_ongoing_requests >= 512 * 8


def test_the_config_derives_the_default_and_takes_a_tenants_own():
    config = AppConfig(replicas=ReplicaSettings(max_ongoing_requests=1000, gpus_per_rank=0),
                       tenants=TenantsSettings(default=TenantDefaults(max_groups_in_flight=10)),
                       engine={"kind": "scripted"})
    assert config.waiting_members_limit("a") == 10 * (config.limits.max_candidates_per_group - 1)
    own = config.model_copy(update={"tenants": TenantsSettings(default=TenantDefaults(max_waiting_members=7))})
    assert own.waiting_members_limit("a") == 7
    unbounded = config.model_copy(update={"tenants": TenantsSettings()})
    assert unbounded.waiting_members_limit("a") == waiting_members_bound(1000, largest_group=26) == 500


class _Fives:
    """Scores every candidate 5."""

    async def score_group(self, group: GroupRequest) -> GroupResult:
        return GroupResult(group_id=group.group_id, scores=[5] * len(group.candidates), valid=True, replica="r",
                           attempts=1)


def _members(groups: int, size: int) -> list[MemberRequest]:
    return [MemberRequest(tenant="run", group_id=f"g{g}", group_size=size, index=k, source=f"S{g}.",
                          candidate=f"c{g}-{k}", src_lang="en", trg_lang="de")
            for g in range(groups) for k in range(size)]


def _worst_order(members: list[MemberRequest], size: int) -> list[MemberRequest]:
    """Every group filled to one short of complete, group after group, then the members that complete them."""
    return [m for m in members if m.index < size - 1] + [m for m in members if m.index == size - 1]


async def _refusals(limit: int, order: list[MemberRequest]) -> int:
    """Members refused when ``order`` arrives at an assembler with this waiting limit (the group-mates of
    refused members, left waiting, are answered by closing it)."""
    assembler = GroupAssembler(_Fives(), AssemblySettings(assembly_timeout_s=600.0, waiting_limit=lambda tenant: limit))
    tasks = [asyncio.create_task(assembler.submit(m)) for m in order]
    for _ in range(10):  # every submit registers or is answered; complete groups are scored
        await asyncio.sleep(0)
    await assembler.close()
    answers = await asyncio.gather(*tasks)
    return sum(answer.failure == "overloaded" for answer in answers)


@pytest.mark.parametrize("groups,size", [(16, 8), (32, 4)])
async def test_a_step_waits_without_a_refusal_on_the_slots_sized_for_it_in_any_order(groups, size):
    members = _members(groups, size)
    bound = waiting_members_bound(slots_for_step(groups, size), largest_group=26)
    assert await _refusals(bound, _worst_order(members, size)) == 0
    assert await _refusals(bound, random.Random(3).sample(members, len(members))) == 0
    # Half that bound (grrm.yaml's former 4096 slots, halved, for its 512 x 8) refuses the worst order.
    assert await _refusals(bound // 2, _worst_order(members, size)) > 0

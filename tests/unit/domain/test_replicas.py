"""The replica set: picking, draining, capacity; examples, then a state machine against a naive model."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domain.replicas import Replica, ReplicaSet, ReplicaState, pick

A, B, C = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"


def test_least_loaded_wins_and_ties_rotate() -> None:
    replicas = ReplicaSet(4, [A, B])
    picks = [replicas.take() for _ in range(6)]
    assert picks == [A, B, A, B, A, B]  # 3 + 3: the seed's cap of 6 over two replicas
    replicas.release(A)
    assert replicas.take() == A  # the least loaded, whatever the rotation says
    for _ in range(4):
        replicas.release(B if replicas.held(B) > replicas.held(A) else A)
    order = [replicas.take() for _ in range(2)]
    assert sorted(order) == [A, B]  # equal loads again: one each


def test_rotation_over_three_with_immediate_releases_is_round_robin() -> None:
    replicas = ReplicaSet(1, [C, A, B])
    seen = []
    for _ in range(9):
        address = replicas.take()
        assert address is not None
        seen.append(address)
        replicas.release(address)
    assert seen == [A, B, C] * 3


def test_a_request_taking_k_slots_needs_k_free_on_one_replica() -> None:
    replicas = ReplicaSet(4, [A, B])
    assert replicas.take(3) == A and replicas.take(3) == B  # A 3, B 3: 2 free in total
    assert replicas.choose(2) is None and replicas.take(1) == A  # the tie rotates past B to A
    assert replicas.in_flight() == 7
    replicas.release(A, 3)
    assert replicas.choose(4) is None and replicas.take(3) == A


def test_full_replicas_give_none() -> None:
    replicas = ReplicaSet(2, [A])
    assert [replicas.take(), replicas.take(), replicas.take()] == [A, A, None]
    assert ReplicaSet(2).take() is None  # no ready replica at all


def test_draining_gets_nothing_new_finishes_and_is_forgotten() -> None:
    replicas = ReplicaSet(4, [A, B])
    assert replicas.take() == A and replicas.take() == B
    replicas.update([A])  # B left the discovery answer
    assert replicas.state(B) is ReplicaState.DRAINING
    assert {replicas.take() for _ in range(3)} == {A}
    assert [(r.address, r.state, r.in_flight) for r in replicas.replicas()] == [
        (A, ReplicaState.READY, 4), (B, ReplicaState.DRAINING, 1),
    ]
    replicas.release(B)
    assert replicas.state(B) is None and [r.address for r in replicas.replicas()] == [A]


def test_a_replica_that_reappears_keeps_its_counts() -> None:
    replicas = ReplicaSet(4, [A, B])
    replicas.take(), replicas.take(), replicas.take()  # A 2, B 1
    replicas.update([A])
    replicas.update([A, B])
    assert replicas.state(B) is ReplicaState.READY and replicas.held(B) == 1
    assert replicas.take() == B  # the least loaded: its count was kept


def test_live_cap_is_the_smaller_of_the_admission_cap_and_the_ready_slots() -> None:
    replicas = ReplicaSet(4, [A, B])
    assert (replicas.capacity(), replicas.live_cap(6)) == (8, 6)
    replicas.update([A])
    assert replicas.live_cap(6) == 4  # shrinks as replicas go
    replicas.update([])
    assert replicas.live_cap(6) == 0
    replicas.update([A, B, C])
    assert replicas.live_cap(6) == 6  # grows back, never past the configured cap


def test_release_of_more_than_held_is_a_caller_bug() -> None:
    replicas = ReplicaSet(4, [A])
    with pytest.raises(KeyError):
        replicas.release(A)
    replicas.take()
    with pytest.raises(KeyError):
        replicas.release(A, 2)
    with pytest.raises(ValueError, match="limit"):
        ReplicaSet(0)


# -- the rule itself, against a brute-force reference ----------------------------------

addresses = st.sampled_from([A, B, C, "http://10.0.0.4:8080"])
replica_lists = st.lists(
    st.builds(
        lambda address, state, limit, used: Replica(address=address, state=state, in_flight=min(used, limit),
                                                    limit=limit),
        addresses, st.sampled_from(ReplicaState), st.integers(1, 4), st.integers(0, 4),
    ),
    max_size=4, unique_by=lambda r: r.address,
)  # fmt: skip


@given(replica_lists, st.integers(1, 4), st.none() | addresses)
def test_pick_is_the_least_loaded_with_room_rotating_after_the_last(
    replicas: list[Replica], slots: int, after: str | None
) -> None:
    fits = [r for r in replicas if r.state is ReplicaState.READY and r.limit - r.in_flight >= slots]
    chosen = pick(replicas, slots, after)
    if not fits:
        assert chosen is None
        return
    least = min(r.in_flight for r in fits)
    tied = sorted(r.address for r in fits if r.in_flight == least)
    later = [a for a in tied if after is not None and a > after]
    assert chosen is not None and chosen.address == (later or tied)[0]


class ReplicaSetMachine(RuleBasedStateMachine):
    """Random discovery answers, takes and releases: counts, states and capacity stay exact."""

    def __init__(self) -> None:
        super().__init__()
        self.limit = 3
        self.set = ReplicaSet(self.limit, [A, B])
        self.ready = {A, B}
        self.leases: list[tuple[str, int]] = []  # (address, slots) of requests in flight

    def held(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for address, slots in self.leases:
            out[address] += slots
        return out

    @rule(ready=st.sets(addresses, max_size=4))
    def discover(self, ready: set[str]) -> None:
        self.set.update(ready)
        self.ready = set(ready)

    @rule(slots=st.integers(1, 3))
    def take(self, slots: int) -> None:
        held = self.held()
        room = [a for a in self.ready if self.limit - held[a] >= slots]
        address = self.set.take(slots)
        if not room:
            assert address is None
            return
        assert address in room and held[address] == min(held[a] for a in room)
        self.leases.append((address, slots))

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        address, slots = self.leases.pop(data.draw(st.integers(0, len(self.leases) - 1)))
        self.set.release(address, slots)

    @invariant()
    def counts_states_and_capacity_are_exact(self) -> None:
        held = self.held()
        for address in (A, B, C, "http://10.0.0.4:8080"):
            assert self.set.held(address) == held[address] <= self.limit
            expected = (ReplicaState.READY if address in self.ready
                        else ReplicaState.DRAINING if held[address] else None)  # fmt: skip
            assert self.set.state(address) is expected
        assert self.set.in_flight() == sum(held.values())
        assert self.set.live_cap(5) == min(5, self.limit * len(self.ready))
        assert [r.address for r in self.set.replicas()] == sorted(self.ready | set(+held))


ReplicaSetMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_replica_set_machine = ReplicaSetMachine.TestCase


@given(st.integers(2, 4), st.integers(1, 40))
def test_equal_loads_spread_evenly(count: int, requests: int) -> None:
    ready = [f"http://10.0.0.{i}:80" for i in range(count)]
    replicas = ReplicaSet(100, ready)
    for _ in range(requests):
        replicas.take()
    loads = [replicas.held(a) for a in ready]
    assert max(loads) - min(loads) <= 1

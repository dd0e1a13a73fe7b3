"""ReplicaSet with ejected and saturated replicas, affinity preferences and the retry's move:
random operations against a plain model of the counts."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domain.replicas import ReplicaSet, ReplicaState

ADDRESSES = [f"http://10.0.0.{i}:8080" for i in range(1, 5)]
addresses = st.sampled_from(ADDRESSES)


class HealthMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.limit = 3
        self.set = ReplicaSet(self.limit, ADDRESSES[:3])
        self.ready, self.ejected, self.saturated = set(ADDRESSES[:3]), set[str](), set[str]()
        self.leases: list[tuple[str, int]] = []

    def held(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for address, slots in self.leases:
            out[address] += slots
        return out

    def open_to_new(self, slots: int, avoid: str | None = None) -> list[str]:
        held = self.held()
        return [a for a in self.ready - self.ejected - self.saturated
                if a != avoid and self.limit - held[a] >= slots]  # fmt: skip

    @rule(ready=st.sets(addresses, max_size=4))
    def discover(self, ready: set[str]) -> None:
        self.set.update(ready)
        self.ready = ready

    @rule(ejected=st.sets(addresses, max_size=2), saturated=st.sets(addresses, max_size=2))
    def health(self, ejected: set[str], saturated: set[str]) -> None:
        self.set.set_ejected(ejected)
        self.set.set_saturated(saturated)
        self.ejected, self.saturated = ejected, saturated

    @rule(slots=st.integers(1, 2), prefer=st.lists(addresses, max_size=2, unique=True), extra=st.integers(0, 2))
    def take(self, slots: int, prefer: list[str], extra: int) -> None:
        room = self.open_to_new(slots)
        address = self.set.take(slots, prefer, extra)
        if not room:
            assert address is None
            return
        held = self.held()
        least = min(held[a] for a in room)
        assert address in room and held[address] <= least + extra
        wanted = [a for a in prefer if a in room and held[a] <= least + extra]
        if wanted:
            assert address == wanted[0]
        else:
            assert held[address] == least
        self.leases.append((address, slots))

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        address, slots = self.leases.pop(data.draw(st.integers(0, len(self.leases) - 1)))
        self.set.release(address, slots)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def move(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.leases) - 1))
        address, slots = self.leases[i]
        room = self.open_to_new(slots, avoid=address)
        before = self.set.in_flight()
        target = self.set.move(address, slots)
        assert self.set.in_flight() == before  # the upstream's count never changes during a move
        if not room:
            assert target is None
            return
        assert target in room
        self.leases[i] = (target, slots)

    @invariant()
    def counts_states_and_capacity(self) -> None:
        held = self.held()
        for address in ADDRESSES:
            assert self.set.held(address) == held[address] <= self.limit
            if address in self.ready:
                expected = ReplicaState.EJECTED if address in self.ejected else ReplicaState.READY
            else:
                expected = ReplicaState.DRAINING if held[address] else None
            assert self.set.state(address) is expected
        eligible = self.ready - self.ejected
        assert self.set.eligible() == eligible and self.set.capacity() == self.limit * len(eligible)
        assert self.set.live_cap(7) == min(7, self.limit * len(eligible))


HealthMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_health_machine = HealthMachine.TestCase

"""In-process admission gate: one `SlotLedger` per capped upstream, on asyncio.

Correct in ONE process only (bootstrap refuses several workers with it). The ledger is
the single source of truth; an asyncio future per waiting call is only a wake-up, so a
grant, an expiry or a drain that lands while nobody waits is still seen by the next
`wait`. No background task: expiry is applied lazily on every enter, wait, release and
snapshot, and a waiter's own timer is armed for its queue deadline.

A ticket's owner must end it (`wait` -> lease, or `cancel`) on every path, e.g. in
`except BaseException`: a slot granted to a ticket nobody collects is never given back.

A request takes `slots` (k) of the cap at once, in its place in the queue (head-of-line:
see `domain.admission.ledger.SlotLedger`). An upstream listed in `replica_limits` has
replicas (`domain.replicas.ReplicaSet` inside its ledger): none is ready until
`set_replicas`, and every lease is bound to the replica picked with its slots
(`lease.replica`).

- `gate`: `InMemoryAdmissionGate`, the `ports.admission.AdmissionGate` callers use;
- `ledgers`: the per-upstream state and the operations leases and tickets call back into;
- `tickets`: the leases (granted slots) and queue tickets the gate hands out.
"""

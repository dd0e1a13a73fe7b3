"""Admission of one upstream's requests to its sequence slots (pure: time comes in as `now`).

- `policy`: `AdmissionPolicy`, the configured cap, queue depth, queue wait and queue order;
- `ledger`: `SlotLedger`, the state machine over tickets (arrive, admit, queue, release,
  cancel, expire, close), answering with the values of `decisions`;
- `holdings`: the slots admitted tickets hold, and their replicas;
- `wait_queue`: who waits, until when, and who goes next, in the order of
  `fifo_order` (arrival) or `fair_order` (per consumer weight, within priority bands);
- `retry_after`: the Retry-After a refused or timed-out client is told.
"""

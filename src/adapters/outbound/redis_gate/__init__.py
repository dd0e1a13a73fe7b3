"""Shared admission ledger on Redis: one cap and one queue per upstream (fifo, fair across
consumers by requests, or by tokens served) for ALL gateway processes and pods (the in-memory gate is only correct
inside one process).

Data layout, for `key_prefix` P (default "gateway") and upstream key U (the config
table name); `{U}` is a Redis Cluster hash tag, so one upstream's keys share a slot:

    P:{U}:seq        STRING  INCR counter: arrival sequence numbers (FIFO order)
    P:{U}:queue      ZSET    token -> sequence number; position = ZRANK + 1, O(log n)
    P:{U}:deadlines  ZSET    token -> queue deadline (ms, Redis server time)
    P:{U}:waiters    HASH    token -> owner, for queued tokens
    P:{U}:slots      HASH    token -> owner, for granted slots; HLEN + extra = slots in use
    P:{U}:owners     ZSET    owner -> heartbeat lease expiry (ms, Redis server time)
    P:{U}:wake       pub/sub channel: space-separated tokens just promoted to a slot
  fair mode and max_queued_per_consumer only (fifo without a limit never writes them):
    P:{U}:fair       ZSET    score 0, "<band>:<finish tag>:<seq>:<token>": dispatch order
    P:{U}:entries    HASH    token -> "<fair member> <consumer>" (member '' in fifo)
    P:{U}:counts     HASH    consumer -> waiting requests (max_queued_per_consumer)
    P:{U}:vtime      HASH    band -> virtual time V (finish tag last dispatched from it)
    P:{U}:tags       HASH    "<band>:<consumer>" -> finish tag of its last queued request
  fairness = "tokens" only (lua/tokens.lua):
    P:{U}:service    HASH    consumer -> weighted tokens served / its weight (never expires)
    P:{U}:tlast      HASH    band -> the consumer last admitted in it
    P:{U}:twait      ZSET    score 0, "<band>:<hex consumer>" per consumer waiting in the band
    P:{U}:tqueue     ZSET    score 0, "<band>:<hex consumer>:<seq>:<token>": queued requests
    P:{U}:theld      HASH    consumer -> its requests holding slots (> 0): idle when none
    P:{U}:tholder    HASH    held token -> its consumer (counted down by `free`)
  requests taking k > 1 slots and upstreams with replicas only:
    P:{U}:want       HASH    queued token -> k (k > 1)
    P:{U}:bound      HASH    held token -> "<k> <replica>"
    P:{U}:extra      STRING  sum of k - 1 over held tokens
    P:{U}:replicas   HASH    replica -> slots in flight (every process)
    P:{U}:last       STRING  the replica picked last (round robin)

A token is "<process tag>.<n>", unique per request; an owner is
"<host>:<pid>:<process tag>:g<generation>" and changes when the process is fenced.

Every change is one Lua script (`lua/`, loaded by `scripts.py`), and each reclaims expired
owners, expires lapsed queue entries and promotes the smallest key while it fits (head-
of-line), so a freed slot always goes to the same request whichever process asks (fifo:
the longest waiter). Token service charged in a process goes with its next call on the
upstream (or the refresher's, within 0.5 s), applied before anything else. With
replicas the pick is made in the same script, among the eligible replicas the calling
process passes (ready, not ejected; saturated ones marked), and the one safe retry moves a
lease to another replica in one script (`move`). See docs/redis-ledger.md for the failure
model, fencing, lease sizing, the wake-up latency bound and the token mode.
"""

from adapters.outbound.redis_gate.gate import RedisAdmissionGate
from adapters.outbound.redis_gate.leases import OpenLease, RedisLease
from adapters.outbound.redis_gate.tickets import RedisTicket

__all__ = ["OpenLease", "RedisAdmissionGate", "RedisLease", "RedisTicket"]

"""The Redis admission ledger's Lua scripts, their result codes and the key layout.

Each script is a file in `lua/` beside this module: three common parts are prepended to
each of the others, `common.lua` (the key and argument names, the server time, the slot and
replica helpers: `take`, `free`, `pick`...), `tokens.lua` (the token order of `fairness =
"tokens"` and the charges every call brings) and `queue.lua` (`reclaim`, `expire`,
`promote`, `reply`...), so a script is one text `common.lua + tokens.lua + queue.lua +
<name>.lua` and runs as one atomic unit, exactly as if written in one piece. That is the
only sharing: no other file includes another. The texts are read once, at
import (`importlib.resources`, so they ship in the package), and `LedgerCore` registers
them with redis-py (`register_script`: EVALSHA, loading the script on a NOSCRIPT reply).
A line number in a Redis error counts from the first line of `common.lua`.

What the scripts do, and why atomically, is told at the top of `lua/common.lua`; each
script's own arguments at the top of its file. KEYS: the twenty-four of `KEY_NAMES`
(`upstream_keys`). ARGV starts with the same six: cap, wake channel, per-replica cap (0:
no replicas), the caller's eligible replicas (ready and not ejected: they hold the live
cap; space-separated, the saturated ones, in the cap but never picked, after a lone "|"),
the token service charged in this process since its last call on the upstream (`charges`:
"<consumer in hex> <tokens>" pairs, applied first), the owner; then the script's own.
`enter` takes the arriving request's affinity (`prefer`, `max_extra`) for its own pick
only; `move` is the one safe retry's lease move.

Result of every script: `{code, value, in_use, queued, reclaimed, stamp, replica,
replica_counts, by_priority}`; `in_use` (slots)/`queued` feed the gate's snapshot cache,
`reclaimed` its metrics. `stamp` (server time in microseconds; scripts run one at a time)
orders replies that arrive over different pooled connections, so an older count never
overwrites a newer one. `replica`: the replica the token is bound to when the code says it
holds slots ('' otherwise, or without replicas); `replica_counts`: the flat HGETALL of
`replicas` (empty without replicas), for the gate's `replicas()` view; `by_priority`: the
flat HGETALL of `by_priority` (waiting requests per consumer priority other than 0; the
rest of `queued` is priority 0), for the snapshot's `queued_by_priority`.
"""

from __future__ import annotations

from importlib.resources import files

# Result codes shared by the scripts (first element of the reply).
FENCED = -1  # the calling owner's lease has expired (or it was reclaimed): it is fenced
REJECTED = 0  # enter: queue full  | poll/cancel: the token is nowhere (ended)
ADMITTED = 1  # enter: slot taken  | poll: the token holds a slot  | cancel: withdrawn
QUEUED = 2  # enter: queued      | poll: still queued, value = 1-based position
WITHDRAWN = 1  # cancel: the token was queued and has left the queue
HOLDS = 2  # cancel: the token holds a slot (timeout mode keeps it)
GAVE_BACK = 3  # cancel: the token held a slot and gave it back (cancel mode)

KEY_NAMES = (
    "queue", "deadlines", "waiters", "slots", "owners", "seq",
    "fair", "entries", "counts", "vtime", "tags",  # fair mode / max_queued_per_consumer
    "want", "bound", "extra", "replicas", "last",  # k slots per request / replicas
    "priorities", "by_priority",  # queued requests of consumers with a priority other than 0
    "service", "tlast", "twait", "tqueue",  # fairness = "tokens" (lua/tokens.lua)
    "theld", "tholder",  # fairness = "tokens": who holds slots (an idle consumer is lifted; common.lua `free`)
)
# A band's tags are forgotten once its queue has been empty this long past the newest
# deadline (only a cancelled request's unserved tag can outlive the queue: see `normalize`).
TAGS_GRACE_MS = 60_000
_COMPLEMENT = str.maketrans("0123456789", "9876543210")


def band(priority: int) -> str:
    """An order-preserving string for -priority (any int): higher priority sorts first.

    "p" + 2-digit length + digits for -priority >= 0; "n" + (99 - length) + complemented
    digits below 0. Never contains ":" or " ", which the fair queue's members rely on.
    """
    inverse = -priority
    digits = str(abs(inverse))
    if inverse >= 0:
        return f"p{len(digits):02d}{digits}"
    return f"n{99 - len(digits):02d}{digits.translate(_COMPLEMENT)}"


def upstream_keys(prefix: str, upstream: str) -> tuple[list[str], str]:
    """The twenty-four keys and the wake channel of one upstream.

    `{upstream}` is a Redis Cluster hash tag: one upstream's keys live in one slot, so
    its scripts also run on a cluster; different upstreams may live on different nodes.
    """
    base = f"{prefix}:{{{upstream}}}"
    return [f"{base}:{name}" for name in KEY_NAMES], f"{base}:wake"


def charges(pending: dict[str, float]) -> str:
    """The charges ARGV of a call: "<consumer in hex> <tokens>" pairs (a name may hold any
    character; hex holds no space)."""
    return " ".join(f"{name.encode().hex()} {tokens!r}" for name, tokens in pending.items())


def _lua(name: str) -> str:
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


NAMES = ("enter", "release", "cancel", "poll", "maintain", "heartbeat", "purge", "move")
_COMMON = _lua("common") + _lua("tokens") + _lua("queue")
ALL = {name: _COMMON + _lua(name) for name in NAMES}  # script name -> the text sent to Redis

"""The Lua scripts of the Redis consumer counters, and their key layout.

Each script is a file in `lua/` beside this module, sent to Redis as one text of three
files: `clock.lua` (`now`, in ms), then the common part of its kind, then its own file:

- rate scripts: `rate.lua` (the consumer's buckets and day window refilled to now, `store`,
  `reply`) + `take_request`, `reserve_tokens` or `settle`;
- slot scripts: `held.lua` (lapsed leases dropped, `keep`) + `acquire`, `release` or `renew`.

That is the only sharing: no other file includes another. The texts are read once, at
import (`importlib.resources`, so they ship in the package), and the ledger and the
concurrency register them with redis-py (`register_script`: EVALSHA, loading the script on
a NOSCRIPT reply). A line number in a Redis error counts from the first line of `clock.lua`.

Each operation is ONE script, so "check and take" is atomic across all gateway processes:
one request (`take_request`, before the body is read) or a token estimate in every token
limit (`reserve_tokens`, after decoding). The rate scripts compute exactly what
`domain.rate_limits` computes (same integer units, same order of steps) and reply with the
state after the step, so the snapshot and Retry-After are derived by the domain code
itself, never twice. Each file's KEYS and ARGV are told at its top.

Time is Redis `TIME` (one clock for every replica) unless ARGV[1] carries a time in ms
(tests drive the scripts with a fake clock through that; the gateway never does).
"""

from __future__ import annotations

from importlib.resources import files

CHANNEL = "consumers:free"  # under the prefix: the name of a consumer whose slot was released


def rate_key(prefix: str, consumer: str) -> str:
    """`{consumer:NAME}` is a Redis Cluster hash tag: one consumer's keys share a slot."""
    return f"{prefix}:{{consumer:{consumer}}}:rate"


def held_key(prefix: str, consumer: str) -> str:
    return f"{prefix}:{{consumer:{consumer}}}:held"


def _lua(name: str) -> str:
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


_CLOCK = _lua("clock")
_RATE = _CLOCK + _lua("rate")  # a rate script is this + its own file
_HELD = _CLOCK + _lua("held")  # a slot script is this + its own file
TAKE_REQUEST = _RATE + _lua("take_request")
RESERVE_TOKENS = _RATE + _lua("reserve_tokens")
SETTLE = _RATE + _lua("settle")
ACQUIRE = _HELD + _lua("acquire")
RELEASE = _HELD + _lua("release")
RENEW = _HELD + _lua("renew")
ALL = {  # script name (its file's) -> the text sent to Redis
    "take_request": TAKE_REQUEST, "reserve_tokens": RESERVE_TOKENS, "settle": SETTLE,
    "acquire": ACQUIRE, "release": RELEASE, "renew": RENEW,
}

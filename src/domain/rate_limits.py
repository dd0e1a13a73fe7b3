"""Request and token limits of one consumer: token buckets and a UTC-day window (pure).

Each per-minute limit L is a token bucket of capacity L refilled continuously at L/60
per second, the way OpenAI and Anthropic describe their limits; `tokens_per_day` is a
fixed window per UTC day. Time comes in as wall-clock seconds since the epoch (`now`):
POSIX time has no leap seconds, so `now // 86400` is exactly the UTC day.

Arithmetic is in integers so that the Redis scripts (Lua, doubles) compute exactly the
same levels: time in milliseconds, a bucket level in units of 1/SCALE token, so a bucket
of L per minute gains exactly L units per millisecond. Exact in a double while
L * SCALE < 2**53, i.e. for limits below 1.5e11 per minute.

Decisions (the contract of both usage ledgers). A request is decided in two steps, since
its size is known only once its body is read and decoded:
- `take_request`, before the body is read: admitted when the request bucket holds >= 1,
  and then charged one request (for good: a request refused later still counted);
- `reserve_tokens`, after decoding: admitted only if every token limit admits the
  estimate `tokens`; it then reserves it in all of them, or (refused) in none;
- tokens per minute: admitted when the bucket holds >= min(tokens, L) (a request larger
  than the whole limit still runs from a full bucket); the reservation subtracts all of
  `tokens`, so the level may go negative: concurrent requests together exceed the limit
  by at most one reservation, and later ones wait longer;
- tokens per day: admitted when used + min(tokens, L) <= L; the window restarts at UTC
  midnight;
- settle(actual) replaces the reservation in the windows it was taken from: the bucket
  gets the difference (never above its capacity), the day window only if it is still
  the same day.
"""

from __future__ import annotations

import msgspec

from domain.consumers import ConsumerLimits, LimitKind, RateSnapshot, RateState
from domain.errors import RateLimited

SCALE = 60_000  # bucket units per token = milliseconds per minute
DAY_MS = 86_400_000
_REQUESTS, _TOKENS, _DAY = LimitKind.REQUESTS_PER_MINUTE, LimitKind.TOKENS_PER_MINUTE, LimitKind.TOKENS_PER_DAY


def to_ms(now: float) -> int:
    """Wall-clock seconds -> whole milliseconds (nearest: `ms / 1000` maps back to `ms`)."""
    return round(now * 1000)


def _limit(value: int | None) -> int | None:
    # the keys file loader refuses limits < 1; never divide by zero if one slips through
    return None if value is None else max(1, value)


def effective_limits(limits: ConsumerLimits) -> tuple[int | None, int | None, int | None]:
    """(requests_per_minute, tokens_per_minute, tokens_per_day) as every ledger applies them."""
    return _limit(limits.requests_per_minute), _limit(limits.tokens_per_minute), _limit(limits.tokens_per_day)


def _wait_ms(level: int, need: int, limit: int) -> int:
    """Milliseconds until a bucket of `limit`/minute at `level` holds `need` units."""
    return 0 if level >= need else -(-(need - level) // limit)


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What one admitted request took: settle puts it back in the same windows."""

    tokens: int  # the estimate reserved
    bucket: bool  # charged to the tokens-per-minute bucket
    day: int  # the UTC day charged (days since the epoch), -1 = no day window
    snapshot: RateSnapshot  # the consumer's limits right after the reservation


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    limit: LimitKind  # the violated limit that takes longest to admit the request
    wait_ms: int  # until EVERY violated limit admits it (nothing else happening)

    @property
    def retry_after(self) -> int:
        """Whole seconds, at least 1."""
        return max(1, -(-self.wait_ms // 1000))


class ConsumerUsage:
    """One consumer's counters: both buckets (levels at `stamp`) and the day window.

    A bucket level of None means full (a consumer never seen, or a limit just added).
    Every operation first `advance`s the state to `now_ms`; refilling is idempotent
    (refilling to t1 then to t2 equals refilling to t2), so advancing on a refusal
    changes nothing observable.
    """

    __slots__ = ("day", "requests", "stamp", "tokens", "used")

    def __init__(self, requests: int | None = None, tokens: int | None = None, stamp: int = 0,
                 day: int = -1, used: int = 0) -> None:
        self.requests, self.tokens, self.stamp = requests, tokens, stamp
        self.day, self.used = day, used

    def advance(self, limits: ConsumerLimits, now_ms: int) -> None:
        # the refill and `_limit` written out: this runs two or three times per limited request.
        stamp = self.stamp
        elapsed = now_ms - stamp if now_ms > stamp else 0
        rpm = limits.requests_per_minute
        if rpm is None:
            self.requests = None
        else:
            rpm = rpm if rpm > 1 else 1
            full, level = rpm * SCALE, self.requests
            self.requests = full if level is None or level + elapsed * rpm >= full else level + elapsed * rpm
        tpm = limits.tokens_per_minute
        if tpm is None:
            self.tokens = None
        else:
            tpm = tpm if tpm > 1 else 1
            full, level = tpm * SCALE, self.tokens
            self.tokens = full if level is None or level + elapsed * tpm >= full else level + elapsed * tpm
        if now_ms > stamp:
            self.stamp = now_ms
        today = now_ms // DAY_MS
        if self.day != today:
            self.day, self.used = today, 0

    def request_refusal(self, limits: ConsumerLimits, now_ms: int) -> Refusal | None:
        """Why one more request is not admitted now (after `advance`), or None."""
        rpm, level = limits.requests_per_minute, self.requests
        if rpm is not None and level is not None and level < SCALE:
            return Refusal(limit=LimitKind.REQUESTS_PER_MINUTE, wait_ms=_wait_ms(level, SCALE, rpm if rpm > 1 else 1))
        return None

    def token_refusal(self, limits: ConsumerLimits, tokens: int, now_ms: int) -> Refusal | None:
        """Why a reservation of `tokens` is not admitted now (after `advance`), or None: the
        violated limit that takes longest to admit it (the per-minute one on a tie)."""
        tpm, tpd = limits.tokens_per_minute, limits.tokens_per_day
        worst: Refusal | None = None
        level = self.tokens
        if tpm is not None and level is not None:
            tpm = tpm if tpm > 1 else 1
            need = (tokens if tokens < tpm else tpm) * SCALE
            if level < need:
                worst = Refusal(limit=LimitKind.TOKENS_PER_MINUTE, wait_ms=_wait_ms(level, need, tpm))
        if tpd is not None:
            tpd = tpd if tpd > 1 else 1
            if self.used + (tokens if tokens < tpd else tpd) > tpd:
                wait = DAY_MS - now_ms % DAY_MS
                if worst is None or wait > worst.wait_ms:
                    worst = Refusal(limit=LimitKind.TOKENS_PER_DAY, wait_ms=wait)
        return worst

    def receipt(self, limits: ConsumerLimits, tokens: int, now_ms: int) -> Receipt:
        """The receipt of a reservation of `tokens` just charged to this state."""
        return Receipt(tokens=tokens, bucket=self.tokens is not None and limits.tokens_per_minute is not None,
                       day=-1 if limits.tokens_per_day is None else self.day,
                       snapshot=self.snapshot(limits, now_ms))

    def take_request(self, limits: ConsumerLimits, now: float) -> RateSnapshot:
        """Charge one request, or raise `RateLimited`; the snapshot after it."""
        now_ms = round(now * 1000)  # `to_ms`, written out (every limited request)
        self.advance(limits, now_ms)
        level = self.requests  # not None after `advance` iff there is a request limit
        if level is not None:
            if level < SCALE:
                refused = self.request_refusal(limits, now_ms)
                assert refused is not None
                raise RateLimited(refused.limit, refused.retry_after, self.snapshot(limits, now_ms))
            self.requests = level - SCALE
        return self.snapshot(limits, now_ms)

    def reserve_tokens(self, limits: ConsumerLimits, tokens: int, now: float) -> Receipt:
        """Reserve a request's `tokens` estimate in every token limit, or raise `RateLimited`."""
        now_ms, tokens = round(now * 1000), tokens if tokens > 0 else 0
        self.advance(limits, now_ms)
        refused = self.token_refusal(limits, tokens, now_ms)
        if refused is not None:
            raise RateLimited(refused.limit, refused.retry_after, self.snapshot(limits, now_ms))
        level = self.tokens  # not None after `advance` iff there is a per-minute token limit
        if level is not None:
            self.tokens = level - tokens * SCALE
        day = -1
        if limits.tokens_per_day is not None:
            self.used += tokens
            day = self.day
        return Receipt(tokens=tokens, bucket=level is not None, day=day, snapshot=self.snapshot(limits, now_ms))

    def settle(self, limits: ConsumerLimits, receipt: Receipt, actual: int, now: float) -> None:
        """Replace the reservation by `actual` tokens: refund or extra charge."""
        now_ms = round(now * 1000)  # `to_ms`
        self.advance(limits, now_ms)
        diff = (actual if actual > 0 else 0) - receipt.tokens
        level = self.tokens  # not None after `advance` iff there is a per-minute token limit
        if receipt.bucket and level is not None:
            tpm = limits.tokens_per_minute
            full = (tpm if tpm is not None and tpm > 1 else 1) * SCALE
            level -= diff * SCALE
            self.tokens = level if level < full else full
        if limits.tokens_per_day is not None and receipt.day == self.day:
            self.used = max(0, self.used + diff)

    def snapshot(self, limits: ConsumerLimits, now_ms: int) -> RateSnapshot:
        """The request limit and the token limit that apply (per minute, else per day)."""
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        requests = tokens = None
        # Both bucket states written out (no helper call each): this runs twice per limited request.
        if rpm is not None:
            rpm = rpm if rpm > 1 else 1
            level, full = self.requests, rpm * SCALE
            if level is None or level >= full:
                requests = RateState(kind=_REQUESTS, limit=rpm, remaining=rpm, reset_seconds=0.0)
            else:
                requests = RateState(kind=_REQUESTS, limit=rpm, remaining=level // SCALE if level > 0 else 0,
                                     reset_seconds=-((level - full) // rpm) / 1000)
        if tpm is not None:
            tpm = tpm if tpm > 1 else 1
            level, full = self.tokens, tpm * SCALE
            if level is None or level >= full:
                tokens = RateState(kind=_TOKENS, limit=tpm, remaining=tpm, reset_seconds=0.0)
            else:
                tokens = RateState(kind=_TOKENS, limit=tpm, remaining=level // SCALE if level > 0 else 0,
                                   reset_seconds=-((level - full) // tpm) / 1000)
        else:
            tpd = limits.tokens_per_day
            if tpd is not None:
                tpd = tpd if tpd > 1 else 1
                used = self.used if self.day == now_ms // DAY_MS else 0
                tokens = RateState(kind=_DAY, limit=tpd, remaining=max(0, tpd - used),
                                   reset_seconds=(DAY_MS - now_ms % DAY_MS) / 1000)
        return RateSnapshot(requests=requests, tokens=tokens)

    def idle_ms(self, limits: ConsumerLimits, now_ms: int) -> int:
        """Milliseconds (after `advance`) until this state equals a fresh one: full buckets and
        nothing used today. The Redis key's TTL; 0 = it can be forgotten now."""
        idle = 0
        for level, limit in ((self.requests, _limit(limits.requests_per_minute)),
                             (self.tokens, _limit(limits.tokens_per_minute))):
            if level is not None and limit is not None:
                idle = max(idle, _wait_ms(level, limit * SCALE, limit))
        if limits.tokens_per_day is not None and self.used > 0:
            idle = max(idle, DAY_MS - now_ms % DAY_MS)
        return idle


"""Charging a consumer's token service on an upstream under `fairness = "tokens"`.

The queue of such an upstream admits next the waiting consumer that was served the fewest
weighted tokens (`domain.admission.token_order`); this is what tells it. A request's meter
becomes a `ChargedMeter` once it is admitted there (only there: on `fifo` and `fair`
upstreams nothing changes and nothing is charged):

- at admission, the prompt's estimate (`domain.usage_estimate.prompt_tokens`, the one the
  consumer limits reserve);
- while it streams, its output as counted so far (one token per delta), in batches: when 16
  tokens have gathered, or 0.5 s after the last charge when fewer have (a slow stream still
  counts while it runs). The order only matters when a slot is given out, i.e. when some
  request ends, so a service a batch behind changes at most one dispatch by less than one
  short answer; and a charge per token would cost a call per delta for nothing (and, with a
  shared ledger, a round trip each);
- at the end, before the slot is given back (so the next dispatch sees it), the upstream's
  usage corrects what was charged (prompt and output), or the estimate stands when it
  reports none. A non-streamed answer is charged its output here, at once.
"""

from __future__ import annotations

from domain.canonical import StreamChunk
from domain.consumers import Consumer
from domain.usage_estimate import Estimable, UsageMeter
from ports.admission import AdmissionGate
from ports.clock import Clock

CHARGE_EVERY_TOKENS = 16
CHARGE_EVERY_SECONDS = 0.5


class ChargedMeter(UsageMeter):
    """A `UsageMeter` that charges its upstream's gate what it counts (module doc)."""

    __slots__ = ("_at", "_clock", "_consumer", "_gate", "_input", "_output", "_upstream")

    def __init__(
        self, request: Estimable, gate: AdmissionGate, upstream: str, consumer: Consumer, clock: Clock,
        prompt: int,
    ) -> None:
        super().__init__(request)
        self._prompt = prompt
        self._gate, self._upstream, self._consumer, self._clock = gate, upstream, consumer, clock
        self._input = self._output = 0  # charged so far
        self._at = clock.now()  # when last charged

    def admitted(self) -> ChargedMeter:
        """Charge the prompt's estimate (the request was just admitted)."""
        self._charge(self.prompt, 0)
        return self

    def feed_batch(self, batch: list[StreamChunk]) -> None:
        UsageMeter.feed_batch(self, batch)
        fresh = self._deltas - self._output
        if fresh >= CHARGE_EVERY_TOKENS or (fresh > 0 and self._clock.now() - self._at >= CHARGE_EVERY_SECONDS):
            self._charge(0, fresh)

    def settle(self) -> None:
        """Charge the difference between what was used (`usage`) and what was charged."""
        usage = self.usage()
        self._charge(usage.input_tokens - self._input, usage.output_tokens - self._output)

    def _charge(self, input_tokens: int, output_tokens: int) -> None:
        if input_tokens or output_tokens:
            self._gate.charge(self._upstream, self._consumer, input_tokens, output_tokens)
            self._input += input_tokens
            self._output += output_tokens
        self._at = self._clock.now()


class ServiceCharges:
    """Makes the `ChargedMeter` of a request admitted on a metered upstream (one per service)."""

    __slots__ = ("_clock", "_gate")

    def __init__(self, gate: AdmissionGate, clock: Clock) -> None:
        self._gate = gate
        self._clock = clock

    def meter(self, meter: UsageMeter, request: Estimable, upstream: str, consumer: Consumer) -> ChargedMeter | None:
        """None unless `upstream` is metered; else a charged meter taking `meter`'s place (nothing
        fed yet: called at admission), its prompt estimate charged."""
        if not self._gate.metered(upstream):
            return None
        return ChargedMeter(request, self._gate, upstream, consumer, self._clock, meter.prompt).admitted()

"""A request's charges to a `fairness = "tokens"` upstream, through the in-process gate: the
prompt at admission, output in batches while it streams, the upstream's usage at the end."""

from __future__ import annotations

from tests.unit.adapters.test_memory_gate import FakeClock

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from application.service_charge import CHARGE_EVERY_SECONDS, CHARGE_EVERY_TOKENS, ChargedMeter, ServiceCharges
from domain.admission.policy import AdmissionPolicy
from domain.admission.token_order import TokenOrder
from domain.canonical import ChatRequest, Message, StreamChunk, TextDelta, TextPart, TextRun, Usage, UsageReport
from domain.consumers import Consumer
from domain.usage_estimate import UsageMeter, prompt_tokens

A = Consumer(name="a")
REQUEST = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="x" * 400)])])
PROMPT = prompt_tokens(REQUEST)  # 100 + 4


def setup() -> tuple[InMemoryAdmissionGate, FakeClock, TokenOrder]:
    clock = FakeClock()
    policy = AdmissionPolicy(max_in_flight=1, queue_depth=5, queue_timeout_seconds=30, fairness="tokens",
                             output_token_weight=2.0)
    gate = InMemoryAdmissionGate({"up": policy, "plain": None}, clock)
    ledger = gate._ups["up"].ledger
    assert ledger is not None and ledger.tokens is not None
    return gate, clock, ledger.tokens


def deltas(n: int) -> list[StreamChunk]:
    return [StreamChunk(events=[TextDelta(text="t")]) for _ in range(n)]


def test_only_a_metered_upstream_gets_a_charged_meter() -> None:
    gate, clock, order = setup()
    charges = ServiceCharges(gate, clock)
    assert charges.meter(UsageMeter(REQUEST), REQUEST, "plain", A) is None
    meter = charges.meter(UsageMeter(REQUEST), REQUEST, "up", A)
    assert isinstance(meter, ChargedMeter)
    assert order.service("a") == PROMPT  # the prompt's estimate, at admission


def test_output_is_charged_in_batches_of_tokens_or_time_and_corrected_at_the_end() -> None:
    gate, clock, order = setup()
    meter = ServiceCharges(gate, clock).meter(UsageMeter(REQUEST), REQUEST, "up", A)
    assert meter is not None
    meter.feed_batch(deltas(CHARGE_EVERY_TOKENS - 1))
    assert order.service("a") == PROMPT  # not yet: fewer than 16, and no time passed
    meter.feed_batch([StreamChunk(events=[TextRun(texts=["u", "v"])])])
    assert order.service("a") == PROMPT + 2 * (CHARGE_EVERY_TOKENS + 1)
    meter.feed_batch(deltas(1))
    assert order.service("a") == PROMPT + 2 * (CHARGE_EVERY_TOKENS + 1)
    clock.advance(CHARGE_EVERY_SECONDS)
    meter.feed_batch(deltas(1))  # a slow stream still counts while it runs
    assert order.service("a") == PROMPT + 2 * (CHARGE_EVERY_TOKENS + 3)
    meter.feed_batch([StreamChunk(events=[UsageReport(usage=Usage(input_tokens=90, output_tokens=25))])])
    meter.settle()
    assert order.service("a") == 90 + 2 * 25  # the upstream's usage replaces the estimates
    meter.settle()  # idempotent
    assert order.service("a") == 90 + 2 * 25
    assert meter.usage() == Usage(input_tokens=90, output_tokens=25)


def test_a_cut_stream_keeps_its_estimate() -> None:
    gate, clock, order = setup()
    meter = ServiceCharges(gate, clock).meter(UsageMeter(REQUEST), REQUEST, "up", A)
    assert meter is not None
    meter.feed_batch(deltas(5))
    meter.settle()  # hung up: no usage came
    assert order.service("a") == PROMPT + 2 * 5

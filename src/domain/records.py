"""What the edge reports about each finished request (logs, metrics, traces)."""

from __future__ import annotations

from msgspec import Struct

from domain.consumers import RateSnapshot


class RequestRecord(Struct, kw_only=True):
    """One finished request. `surface` is a label: nothing decides on it."""

    request_id: str
    surface: str
    route: str
    method: str
    status: int
    duration_seconds: float
    # What the request asked of the model server: "chat" (every chat dialect),
    # "text_completion" or "embeddings" (the GenAI semantic conventions' operation names).
    operation: str = "chat"
    model: str | None = None  # the client's name for it (cut at 256 characters)
    upstream: str | None = None
    # The configured model name the upstream was called with (an alias resolved): metrics
    # label with it, never with the client's string, so clients cannot add series.
    upstream_model: str | None = None
    # The replica the request was bound to at admission (`host:port`; `[endpoints]` only).
    endpoint: str | None = None
    # The replica a failed first call went to, when the one safe retry sent the request to
    # `endpoint` instead (`host:port`; docs/operations.md "Replica health, load and affinity").
    retried_from: str | None = None
    # Continuations of a broken answer on another replica (`domain.resume`), and the token ids
    # they sent again (prompt + generated): the re-prefill the resumes cost.
    resumed: int = 0
    resumed_tokens: int = 0
    stream: bool = False
    # The request's thinking budget was not sent: its upstream does not apply one
    # (`[upstreams.NAME] reasoning`, `application.reasoning`).
    thinking_budget_dropped: bool = False
    error_kind: str | None = None
    client_gone: bool = False
    queue_wait_seconds: float | None = None
    first_token_seconds: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    # Of `input_tokens`, those the upstream's prefix cache served (its usage's `cached_tokens`);
    # None when it did not say.
    cached_tokens: int | None = None
    # How long the request held its upstream slots, from admission to release, times the slots
    # it held (one per sequence): its share of the GPUs. None when it never held a slot.
    slot_seconds: float | None = None
    finish_reason: str | None = None
    # The client's own session id (`X-Claude-Code-Session-Id`), to group an agent's requests.
    session_id: str | None = None
    # Who the request is for (the keys file's consumer name) and the non-secret id of its key;
    # None while nothing was authenticated (auth off, or a refused key).
    consumer: str | None = None
    key_id: str | None = None
    # The consumer's request and token limits after this request's reservation (response
    # headers); None when no limit applies.
    rate: RateSnapshot | None = None
    rate_limit: str | None = None  # the limit a 429 was for (`requests_per_minute`, ...)

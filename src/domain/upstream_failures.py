"""How an upstream call failed, and the two rules that read it: what counts against a
replica (outlier ejection) and when a call may be sent once more, to another replica.

The outbound client attaches a `FailureKind` to the domain error it raises
(`GatewayError.failure`); the kind says how far the call got, which is all both rules need:

| kind | the request reached the replica | the answer's head arrived |
|---|---|---|
| CONNECT | no (refused, unreachable, connect timeout) | no |
| RESET_BEFORE_HEAD | maybe (reset or closed after sending) | no |
| FIRST_BYTE_TIMEOUT | yes | no (it may be generating) |
| UNAVAILABLE | yes | yes: 503 |
| SERVER_ERROR | yes | yes: another 5xx |
| MALFORMED_HEAD | yes | yes, unreadable or not what was asked for |
| AFTER_HEAD | yes | yes, 2xx; the body then failed |

A 4xx is the client's fault (`UpstreamRejected`) and carries no kind; so does a client
that has gone (the call is cancelled, no error).
"""

from __future__ import annotations

import enum


class FailureKind(enum.Enum):
    CONNECT = "connect"
    RESET_BEFORE_HEAD = "reset_before_head"
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    UNAVAILABLE = "http_503"
    SERVER_ERROR = "http_5xx"
    MALFORMED_HEAD = "malformed_head"
    AFTER_HEAD = "after_head"


_COUNTED = frozenset({
    FailureKind.CONNECT, FailureKind.RESET_BEFORE_HEAD, FailureKind.FIRST_BYTE_TIMEOUT,
    FailureKind.UNAVAILABLE, FailureKind.SERVER_ERROR, FailureKind.MALFORMED_HEAD,
})  # fmt: skip

_NOT_STARTED = frozenset({FailureKind.CONNECT, FailureKind.RESET_BEFORE_HEAD, FailureKind.UNAVAILABLE})


def counts_against_replica(kind: FailureKind | None) -> bool:
    """A failure for outlier ejection: connect errors, resets before the head, 5xx, first-byte
    timeouts (and a head that cannot be read). A failure after a 2xx head is not counted (the
    replica answered), nor is a 4xx or a client that went away (`kind` None)."""
    return kind in _COUNTED


def safe_to_retry(kind: FailureKind | None, *, client_gone: bool = False, answer_started: bool = False) -> bool:
    """May this call be sent once to another replica? Only if the failed replica cannot have
    started generating: it was never reached, the connection died before the answer's head, or
    the head was a 503 (the server refused the work). Never after any other head, never after
    a first-byte timeout (the request was sent: it may be generating), never once anything of
    the answer reached the client, never for a client that has gone."""
    return kind in _NOT_STARTED and not client_gone and not answer_started

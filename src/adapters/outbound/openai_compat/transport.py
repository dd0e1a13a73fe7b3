"""The HTTP exchange of one upstream call over aiohttp: send the POST, wait for the answer's
head, read its body, check its status; every failure as its domain error.

Three timeouts, because the wait for headers and the gaps between body reads need
different bounds (a non-streaming answer sends its headers only when generation is
done): `connect_timeout` bounds DNS, TCP and TLS connect (aiohttp's `connect` and
`sock_connect`), `first_byte_timeout` the wait for the response headers (one loop timer
for all calls: `adapters/deadline.py`), `idle_timeout` every single wait for more of the body
(one lazy timer per response: `body_reader.py`).

A POST that meets a keep-alive connection the upstream closed or reset before the
answer's head arrived (the keep-alive race: the upstream never read it) is sent again,
once, to the same replica; aiohttp resends only idempotent methods itself.

Every error raised carries how far the call got (`GatewayError.failure`, a
`domain.upstream_failures.FailureKind`), which outlier ejection and the one safe retry to
another replica read; the error's class, status and message (what the client sees) do not
depend on it. aiohttp's own words (hosts, ports, what a broken upstream sent) are logged,
never shown to clients.
"""

from __future__ import annotations

import logging

import aiohttp
import msgspec
from yarl import URL

from adapters.deadline import Deadlines
from domain.errors import GatewayError, UpstreamError, UpstreamProtocolError, UpstreamTimeout, UpstreamUnavailable
from domain.upstream_failures import FailureKind

from .body_reader import BodyReader
from .context_errors import upstream_rejection
from .session import CURRENT_ATTEMPT, Attempt
from .wire import ERROR_DECODER

log = logging.getLogger("gateway.upstream")

# What a call sends besides its body: never a compressed answer (bytes are relayed as they come).
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json", "Accept-Encoding": "identity"}
SSE_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}


class Transport:
    """The exchanges of one upstream (`name`, in messages and logs), on any of its sessions."""

    __slots__ = ("_deadlines", "_first_byte", "_idle", "_timeout", "name")

    def __init__(self, name: str, connect_timeout: float, first_byte_timeout: float, idle_timeout: float) -> None:
        self.name = name
        # Per call: the first byte and each body read are bounded by our own timers below.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout)
        self._first_byte = first_byte_timeout
        self._deadlines = Deadlines(first_byte_timeout)  # the head waits of every call share one timer
        self._idle = idle_timeout

    async def post(
        self, session: aiohttp.ClientSession, url: URL, body: bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """Send `body` and wait for the response headers; failures as domain errors.

        `request.request_id` is deliberately not sent as `X-Request-Id`: vLLM uses that
        header as its engine request id, and a client-chosen id reused by concurrent
        requests must not collide inside the engine.
        """
        attempt = Attempt()
        try:
            with self._deadlines.start():  # asyncio.timeout's rule on one shared timer (adapters/deadline.py)
                return await self._send(session, url, body, headers, attempt)
        except aiohttp.ConnectionTimeoutError as exc:  # before TimeoutError: it is one
            raise UpstreamTimeout(f"upstream '{self.name}' connect timed out", failure=FailureKind.CONNECT) from exc
        except TimeoutError as exc:
            # Sent: the replica may be generating. Not sent: the connect never finished.
            kind = FailureKind.FIRST_BYTE_TIMEOUT if attempt.sent else FailureKind.CONNECT
            raise UpstreamTimeout(
                f"upstream '{self.name}' sent no response within {self._first_byte:g}s", failure=kind
            ) from exc
        except aiohttp.ClientConnectionError as exc:
            # aiohttp's text names the host and port: logged here, never shown to clients.
            log.warning("upstream %s unreachable: %s", self.name, exc)
            # Refused, unreachable, DNS, TLS: never reached. Otherwise the connection was made and
            # died (reset, closed) before the answer's head.
            connect = isinstance(exc, aiohttp.ClientConnectorError)
            kind = FailureKind.CONNECT if connect else FailureKind.RESET_BEFORE_HEAD
            raise UpstreamUnavailable(f"upstream '{self.name}' is unreachable", failure=kind) from exc
        except aiohttp.ClientResponseError as exc:  # unparsable status line or headers
            # The parser's text quotes what the upstream sent: logged, never shown to clients.
            log.warning("upstream %s sent a malformed HTTP response: %s", self.name, exc)
            raise UpstreamProtocolError(
                f"upstream '{self.name}' sent a malformed HTTP response", failure=FailureKind.MALFORMED_HEAD
            ) from exc
        except aiohttp.ClientError as exc:  # none of the above: not classified, so never retried
            log.warning("upstream %s request failed: %s", self.name, exc)
            raise UpstreamError(f"upstream '{self.name}' request failed") from exc

    async def _send(
        self, session: aiohttp.ClientSession, url: URL, body: bytes, headers: dict[str, str], attempt: Attempt
    ) -> aiohttp.ClientResponse:
        """One POST, sent again once (to the same address) if a reused connection died before the answer's head."""
        token = CURRENT_ATTEMPT.set(attempt)  # the session's connector marks it (session.py)
        try:
            try:
                return await session.post(
                    url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if not attempt.reused or isinstance(exc, aiohttp.ClientConnectorError):
                    raise
            attempt.sent = False  # the resend is a new attempt (never reused: `reused` is not read again)
            return await session.post(url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False)
        finally:
            CURRENT_ATTEMPT.reset(token)

    def body_reader(self, resp: aiohttp.ClientResponse, heartbeat: float | None = None) -> BodyReader:
        """The reader of `resp`'s body, each wait for more bounded by `idle_timeout`."""
        return BodyReader(resp, self._idle, self.name, heartbeat)

    async def read_all(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body, with `idle_timeout` bounding each wait for more (`BodyReader`)."""
        content = resp.content
        if content.is_eof() and content.exception() is None:
            # It all came with the head (most short answers): nothing to wait for, so no timer.
            return content.read_nowait()
        reader = BodyReader(resp, self._idle, self.name)
        try:
            parts = []
            while data := await reader.read():
                parts.append(data)
        finally:
            reader.close()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def check_status(self, resp: aiohttp.ClientResponse) -> None:
        """Raise the domain error for a non-2xx answer (the body carries the message)."""
        status = resp.status
        if 200 <= status < 300:
            return
        kind = FailureKind.UNAVAILABLE if status == 503 else FailureKind.SERVER_ERROR
        try:
            message = _error_message(await self.read_all(resp)) or f"upstream '{self.name}' answered HTTP {status}"
        except GatewayError as exc:
            if status >= 500:  # the head already said what failed; the error body is only its text
                exc.failure = kind
            raise
        if 400 <= status < 500:
            raise upstream_rejection(status, message)
        if status >= 500:
            raise UpstreamError(message, failure=kind)
        raise UpstreamProtocolError(
            f"upstream '{self.name}' answered HTTP {status}", failure=FailureKind.MALFORMED_HEAD
        )


def is_event_stream(content_type: str) -> bool:
    """The header's media type is `text/event-stream` (aiohttp's `content_type` parses the
    whole header, parameters and all, into a new object per response: only this is needed)."""
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"


def _error_message(raw: bytes) -> str | None:
    """The message of vLLM's nested or flat error envelope (cut at 500 characters), else None.

    Any other body (an ingress's HTML 502 naming a pod address and its server version, a
    proxy's text) is never shown to a client: the caller says "answered HTTP N" instead.
    """
    try:
        return ERROR_DECODER.decode(raw).error_message()
    except msgspec.DecodeError:
        return None

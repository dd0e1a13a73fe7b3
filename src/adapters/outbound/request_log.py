"""One structured JSON log line per finished request."""

from __future__ import annotations

import logging

import msgspec

from domain.records import RequestRecord

_encode = msgspec.json.Encoder().encode


class JsonRequestLog:
    """Writes each `RequestRecord` as one JSON line on the `gateway.access` logger."""

    __slots__ = ("_enabled", "_log")

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._log = logging.getLogger("gateway.access")

    def request_started(self, record: RequestRecord, headers: list[tuple[bytes, bytes]]) -> object:
        return None

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        if self._enabled and self._log.isEnabledFor(logging.INFO):
            self._log.info(_encode(record).decode())

"""The access log line: one JSON record per request on `gateway.access`, through the
logger's filters and handlers (what `info()` would do), and none when off."""

from __future__ import annotations

import json
import logging

import pytest

from adapters.outbound.request_log import JsonRequestLog
from domain.records import RequestRecord


def _record() -> RequestRecord:
    return RequestRecord(request_id="r1", surface="openai", route="/v1/chat/completions", method="POST",
                         status=200, duration_seconds=0.5)


def test_one_json_line_per_request_on_the_access_logger(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        JsonRequestLog().request_finished(_record())
    [line] = [r for r in caplog.records if r.name == "gateway.access"]
    assert line.levelno == logging.INFO
    body = json.loads(line.getMessage())
    assert (body["request_id"], body["status"], body["route"]) == ("r1", 200, "/v1/chat/completions")


def test_the_loggers_filters_apply(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("gateway.access")
    drop = logging.Filter("nothing-matches")
    logger.addFilter(drop)
    try:
        with caplog.at_level(logging.INFO, logger="gateway.access"):
            JsonRequestLog().request_finished(_record())
    finally:
        logger.removeFilter(drop)
    assert not [r for r in caplog.records if r.name == "gateway.access"]


def test_off_or_below_info_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        JsonRequestLog(enabled=False).request_finished(_record())
    with caplog.at_level(logging.WARNING, logger="gateway.access"):
        JsonRequestLog().request_finished(_record())
    assert not [r for r in caplog.records if r.name == "gateway.access"]

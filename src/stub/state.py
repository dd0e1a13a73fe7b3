"""What every route of the stub upstream shares: in-flight accounting, the --log, draws, ids.

One ``StubState`` per server, built from its ``StubConfig``: the requests in flight and the
most seen at once (``stub.chat`` and ``stub.generate`` count theirs here and write their own
``--log`` lines to ``log_fd``), the seeded RNG of ``--error-rate`` and ``--fault``, the
``--max-num-seqs`` scheduler, the ``--prefix-cache``, the counter that makes answer ids
unique and the ``/v1/models`` and ``/metrics`` bodies.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import msgspec

from stub.config import StubConfig
from stub.connection import HttpProtocol
from stub.faults import FaultPicker
from stub.prefix_cache import PrefixCache
from stub.scheduler import Scheduler
from stub.schema import encode


class StubState:
    """State shared by all connections: in-flight accounting, log, error RNG, ids."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.log_headers = config.log_headers and bool(config.log_path)
        self.log_bodies = config.log_bodies and bool(config.log_path)
        self.rng = random.Random(config.seed)
        self.faults = (
            FaultPicker(config.fault, config.fault_rate, self.rng, config.fault_after, config.fault_limit)
            if config.fault
            else None
        )
        self.scheduler = Scheduler(config.max_num_seqs) if config.max_num_seqs else None
        self.cache = PrefixCache(config.prefix_cache_blocks) if config.prefix_cache else None
        # a chat answer is written inside data_received when nothing makes it wait (see stub.chat)
        self.immediate = not config.hold and self.cache is None
        self.metrics_body: Callable[[], bytes] | None = None
        if self.scheduler is not None:
            from stub.metrics import scheduler_metrics  # prometheus_client: only loaded when served

            self.metrics_body = scheduler_metrics(self.scheduler, (config.models or ("stub",))[0])
        self.in_flight = 0
        self.max_concurrent = 0
        self.counter = 0
        self.prefix = os.urandom(4).hex()
        self.log_fd: int | None = None
        if config.log_path:  # O_TRUNC: the log starts empty; os.write is write+flush per line
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            self.log_fd = os.open(config.log_path, flags, 0o644)
        now = int(time.time())
        cards = [
            {
                "id": m,
                "object": "model",
                "created": now,
                "owned_by": "stub",
                "root": m,
                "parent": None,
                "max_model_len": config.max_model_len,
            }
            for m in config.models or ("stub",)
        ]
        self.models_body = encode({"object": "list", "data": cards})

    def close(self) -> None:
        if self.log_fd is not None:
            os.close(self.log_fd)
            self.log_fd = None

    def logged_body(self, proto: HttpProtocol) -> str:
        """`` body={...}`` (the request's JSON, compact) with --log-bodies, else nothing."""
        if not self.log_bodies:
            return ""
        try:
            return " body=" + encode(msgspec.json.decode(proto.request_body)).decode()
        except msgspec.DecodeError:
            return " body=" + encode(proto.request_body.decode(errors="replace")).decode()

    def release(self, proto: HttpProtocol) -> None:
        """Idempotent: called when the answer is written and when the client goes away."""
        if proto.counted:
            proto.counted = False
            self.in_flight -= 1

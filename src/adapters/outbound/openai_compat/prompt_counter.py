"""A prompt counted by the upstream's own tokenizer, over the same sessions as its calls.

`count` answers a token-count request; `raise_counted` corrects a context-length refusal whose
prompt size is only a lower bound (vLLM stops counting past the limit): the same server (the
same replica) is asked its count, within `recount_timeout` (`token_count.py` says how).
"""

from __future__ import annotations

from yarl import URL

from domain.canonical import ChatRequest
from domain.completions import CompletionRequest
from domain.errors import ContextLengthExceeded, NotSupported

from .call_targets import CallTargets
from .token_count import APPLY_TEMPLATE, TOKENIZE, count_chat, recount
from .transport import JSON_HEADERS, Transport


class PromptCounter:
    """Counts for one upstream (`root`: its base URL without the trailing slash) or its replicas."""

    __slots__ = ("_helper_urls", "_recount_timeout", "_targets", "_transport")

    def __init__(self, transport: Transport, targets: CallTargets, root: str, recount_timeout: float) -> None:
        self._transport = transport
        self._targets = targets
        self._helper_urls = {path: URL(root + path) for path in (TOKENIZE, APPLY_TEMPLATE)}
        self._recount_timeout = recount_timeout

    async def count(self, request: ChatRequest) -> int:
        return await count_chat(self._ask, request)

    async def raise_counted(
        self, error: ContextLengthExceeded, request: ChatRequest | CompletionRequest, replica: str | None
    ) -> None:
        """Raise `error` with its prompt's real size when it had only a lower bound and the
        server counted it; return (the caller re-raises `error`) otherwise."""
        if error.exact:
            return
        counted = await recount(self._ask, error, request, replica, self._recount_timeout)
        if counted is not error:
            raise counted from error

    async def _ask(self, replica: str | None, path: str, body: bytes) -> bytes:
        """One call of a helper endpoint (`/tokenize`, `/apply-template`) on the upstream or the
        replica: the answer's body; a 404 is `NotSupported`, another failure its domain error."""
        session, url = self._targets.acquire(replica, path, self._helper_urls[path])
        transport = self._transport
        try:
            resp = await transport.post(session, url, body, JSON_HEADERS)
            try:
                if resp.status == 404:
                    raise NotSupported(f"upstream has no {path}")
                await transport.check_status(resp)
                return await transport.read_all(resp)
            finally:
                resp.close()
        finally:
            if replica is not None:
                self._targets.release(replica)

"""Incremental Server-Sent Events parser: bytes in, `data` payloads out.

Pure (no I/O) so it can be fed any split of a byte stream and tested for it. The
socket cuts frames anywhere; only complete events (ended by a blank line) are
returned and the rest waits in a `bytearray`. Lines end in LF or CRLF (bare-CR
line ends, legal in SSE but used by no OpenAI-compatible server, are not split on).
Per the SSE spec: `data` lines of one event are joined with LF, comments (`:`) and
other fields (`event`, `id`, `retry`) are skipped, an event with no `data` line is
not dispatched, and an unterminated event at EOF is discarded.

`whole_events` tells the usual read: whole events with LF line ends only (vLLM's, one HTTP
chunk per event), the first a `data: ` line, for a mapper that cuts them itself and recognises
most of them without parsing (`StreamMapper.feed_events`); `payload_of` reads any block.
"""

from __future__ import annotations

_LF = b"\n"
_END = b"\n\n"
_FAST_PREFIX = b"data: "


class SseOverflow(ValueError):
    """An event grew past the limit without ending: the peer is not speaking SSE."""


class SseDecoder:
    __slots__ = ("_buf", "_limit", "_multiline", "_scan", "pending")

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._scan = 0  # where the search for the next line end resumes
        self._multiline = False  # the pending event already has a complete line
        self._limit = max_event_bytes
        # Bytes of an event not yet terminated (what EOF would discard): an attribute, read per
        # upstream read (a property costs a call), set where the buffer changes (`feed`).
        self.pending = 0

    def feed(self, data: bytes) -> list[bytes]:
        """The `data` payloads of every event completed by `data`, in order."""
        # `ChunkStream` gives the usual read (`whole_events`, nothing pending) to the mapper.
        buf = self._buf
        buf += data
        size = len(buf)
        out: list[bytes] = []
        start = 0
        multiline = self._multiline
        # Walk line ends with a one-byte find (memchr); a multi-byte find of the blank
        # line costs several times more per event on typical 200-byte chunks.
        nl = buf.find(_LF, self._scan)
        while nl >= 0:
            after = nl + 1
            if after == size or (buf[after] == 13 and after + 1 == size):
                break  # cannot tell yet whether a blank line follows
            if buf[after] == 10:
                nxt = after + 1
            elif buf[after] == 13 and buf[after + 1] == 10:
                nxt = after + 2
            else:  # an ordinary line end inside the event
                multiline = True
                nl = buf.find(_LF, after)
                continue
            if not multiline and buf.startswith(_FAST_PREFIX, start, nl) and buf[nl - 1] != 13:
                out.append(bytes(buf[start + 6 : nl]))  # the common case: one `data: ` line
            else:
                payload = parse_event(bytes(buf[start:nl]))
                if payload is not None:
                    out.append(payload)
            start = nxt
            multiline = False
            nl = buf.find(_LF, nxt)
        if start:
            del buf[:start]
        self.pending = len(buf)
        if len(buf) > self._limit:
            raise SseOverflow(f"SSE event larger than {self._limit} bytes")
        self._scan = nl - start if nl >= 0 else len(buf)
        self._multiline = multiline
        return out


def whole_events(data: bytes) -> bool:
    """A read (with nothing pending before it) made of whole events, LF line ends only, that
    starts with a `data: ` line and does not end in more than the blank line (`x\n\n\n`: SSE
    would keep the last LF pending). Split at each `\n\n`, it is the events' blocks, the last
    one empty; split at each `\n\ndata: ` (`StreamMapper.feed_events`), a part per `data: `
    line that starts an event."""
    return data[:6] == _FAST_PREFIX and data[-2:] == _END and data[-3] != 10 and 13 not in data  # no CR


def blocks_of(data: bytes) -> list[bytes]:
    """The blocks of a read `whole_events` accepts (lines without the blank line that ends
    them); a block may be empty (an extra blank line) or hold several lines."""
    blocks = data.split(_END)
    blocks.pop()  # the empty rest after the last event's end
    return blocks


def payload_of(block: bytes) -> bytes | None:
    """`parse_event`, with the usual block (one `data: ` line) taken by a slice."""
    if block[:6] == _FAST_PREFIX and 10 not in block:  # no LF (`10 in` is a memchr; `b"\n" in` is not)
        return block[6:]
    return parse_event(block)


def parse_event(block: bytes) -> bytes | None:
    """The joined `data` of one event's lines (no terminator), or None if it has none."""
    data: list[bytes] | None = None
    for line in block.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line or line[0] == 58:  # blank (only before the event) or ":" comment
            continue
        colon = line.find(b":")
        if colon < 0:
            field, value = line, b""
        else:
            field, value = line[:colon], line[colon + 1 :]
            if value.startswith(b" "):
                value = value[1:]
        if field == b"data":
            if data is None:
                data = [value]
            else:
                data.append(value)
    if data is None:
        return None
    return data[0] if len(data) == 1 else b"\n".join(data)

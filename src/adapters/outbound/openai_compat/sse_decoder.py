"""Incremental Server-Sent Events parser: bytes in, `data` payloads out.

Pure (no I/O) so it can be fed any split of a byte stream and tested for it. The
socket cuts frames anywhere; only complete events (ended by a blank line) are
returned and the rest waits in a `bytearray`. Lines end in LF or CRLF (bare-CR
line ends, legal in SSE but used by no OpenAI-compatible server, are not split on).
Per the SSE spec: `data` lines of one event are joined with LF, comments (`:`) and
other fields (`event`, `id`, `retry`) are skipped, an event with no `data` line is
not dispatched, and an unterminated event at EOF is discarded.

`whole_events` is the shortcut for the usual read: whole events with LF line ends only
(vLLM's, one HTTP chunk per event), cut into their blocks by one split, for a mapper that
recognises most of them without parsing (`StreamMapper.feed_events`); `payload_of` reads any
other block.
"""

from __future__ import annotations

_LF = b"\n"
_END = b"\n\n"
_FAST_PREFIX = b"data: "


class SseOverflow(ValueError):
    """An event grew past the limit without ending: the peer is not speaking SSE."""


class SseDecoder:
    __slots__ = ("_buf", "_limit", "_multiline", "_scan")

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._scan = 0  # where the search for the next line end resumes
        self._multiline = False  # the pending event already has a complete line
        self._limit = max_event_bytes

    @property
    def pending(self) -> int:
        """Bytes of an event not yet terminated (what EOF would discard)."""
        return len(self._buf)

    def whole_events(self, data: bytes) -> list[bytes] | None:
        """The blocks (lines without the blank line that ends them) of a read made of whole
        events with LF line ends only, nothing pending before it; None for any other read
        (`feed` it). A block may be empty (an extra blank line) or hold several lines."""
        if self._buf or data[-2:] != _END or 13 in data:  # a CR (`13 in` is a memchr, `b"\r" in` is not)
            return None
        blocks = data.split(_END)
        if blocks.pop():  # an odd run of LFs at the end (`x\n\n\n`): not split where SSE would
            return None
        return blocks

    def feed(self, data: bytes) -> list[bytes]:
        """The `data` payloads of every event completed by `data`, in order."""
        # `ChunkStream` gives the usual read (whole events, LF only, nothing pending) to `whole_events`.
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
        if len(buf) > self._limit:
            raise SseOverflow(f"SSE event larger than {self._limit} bytes")
        self._scan = nl - start if nl >= 0 else len(buf)
        self._multiline = multiline
        return out


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

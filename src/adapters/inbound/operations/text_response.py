"""A response served with exactly the content type it is given.

Litestar appends `; charset=utf-8` to every `text/...` media type, even one that names its
charset already (`text/plain; charset=utf-8; charset=utf-8`), and the Prometheus exposition
type has one of its own (`text/plain; version=...; charset=utf-8`). A content-type header
given with the response is kept as it is: Litestar only fills one in when there is none.
"""

from __future__ import annotations

from litestar import Response


def text_response(
    body: bytes, content_type: str, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response[bytes]:
    """`body` as `content_type`, its charset (if any) named once."""
    return Response(body, status_code=status_code, media_type=content_type,
                    headers={"content-type": content_type, **(headers or {})})

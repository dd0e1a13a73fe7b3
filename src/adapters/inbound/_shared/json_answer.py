"""A JSON answer with extra headers (rate limits, request ids) for a Litestar `Response`."""

from __future__ import annotations

from litestar import Response

JSON = "application/json"


def json_answer(body: bytes, headers: dict[str, str] | None) -> Response[bytes]:
    """`Response(body, media_type=JSON, headers=headers)`, the same headers on the wire.

    Litestar fills in content-type and content-length with `setdefault` on its header list,
    which decodes and lowercases every header already there, twice per name, and raises a
    KeyError when it is absent: with a limited consumer's six rate-limit headers that was
    most of their cost. Given first, with the values Litestar would set, both are found at
    once.
    """
    if not headers:
        return Response(body, media_type=JSON, headers=headers)
    return Response(body, media_type=JSON,
                    headers={"content-type": JSON, "content-length": str(len(body)), **headers})

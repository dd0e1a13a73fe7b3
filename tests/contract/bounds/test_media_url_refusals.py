"""The predictor is never made to fetch a URL it must not (SSRF through image URLs).

Through a real gateway, with both official SDKs: each refused URL is a `BadRequestError` naming
the field's path in the surface's own style, and the upstream never sees the request.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from tests.contract.bounds.conftest import MODEL, Edge

REFUSED = [
    "file:///var/run/secrets/kubernetes.io/serviceaccount/token",
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "https://169.254.169.254/latest/meta-data/",
    "https://[fd00:ec2::254]/latest/meta-data/",
    "https://2852039166/latest/meta-data/",  # 169.254.169.254 as one decimal number
    "https://0x7f.1:8012/",  # 127.0.0.1 in hex, two parts
    "https://0177.0.0.1/",  # octal
    "https://[::ffff:127.0.0.1]/",
    "https://10.42.7.13:8012/v1/models",
    "https://100.100.100.200/latest/meta-data/",  # CGNAT: Alibaba's metadata service
    "https://localhost:6379/",
    "https://redis.localhost/",
    "https://metadata.google.internal/computeMetadata/v1/",
    "https://reasoning-predictor.llm-serving.svc.cluster.local/",
    "ftp://example.com/cat.png",
    "gopher://example.com:70/_GET",
]
PUBLIC = "https://upload.wikimedia.org/wikipedia/commons/a/a9/Example.jpg"
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def openai_turn(url: str) -> Any:
    return [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip


def image(url: str) -> Any:
    return {"type": "image", "source": {"type": "url", "url": url}}


def anthropic_turn(url: str) -> Any:
    return [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image(url)]}]


def tool_result_turns(url: str) -> Any:
    """A tool's result carrying images: the second one is `url`."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image(PUBLIC), image(url)]}
    return [{"role": "user", "content": "look"}, {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]}]  # fmt: skip


@pytest.mark.parametrize("url", REFUSED)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_sdk_gets_a_bad_request_naming_the_url_field(edge: Edge, url: str, stream: bool) -> None:
    before = edge.reached()
    with pytest.raises(openai.BadRequestError) as caught:
        edge.openai().chat.completions.create(model=MODEL, messages=openai_turn(url), stream=stream)
    assert caught.value.param == "messages[0].content[1].image_url.url" and caught.value.code == "invalid-request"
    assert "`messages[0].content[1].image_url.url`" in caught.value.message
    assert edge.reached() == before


@pytest.mark.parametrize("url", REFUSED)
def test_anthropic_sdk_gets_a_bad_request_naming_the_url_field(edge: Edge, url: str) -> None:
    client, before = edge.anthropic(), edge.reached()
    for messages, where in ((anthropic_turn(url), "messages.0.content.1.source.url"),
                            (tool_result_turns(url), "messages.2.content.0.content.1.source.url")):  # fmt: skip
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=MODEL, max_tokens=8, messages=messages)
        assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert where in caught.value.message
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.count_tokens(model=MODEL, messages=messages)
        assert where in caught.value.message
    with pytest.raises(anthropic.BadRequestError) as caught:
        with client.messages.stream(model=MODEL, max_tokens=8, messages=anthropic_turn(url)) as stream:
            stream.until_done()
    assert "messages.0.content.1.source.url" in caught.value.message
    assert edge.reached() == before


def test_public_and_inline_images_still_reach_the_upstream(edge: Edge) -> None:
    """The check refuses what it must and nothing else (the stub does not fetch images)."""
    before = edge.reached()
    data_url = f"data:image/png;base64,{PIXEL}"
    for url in (PUBLIC, data_url, "https://[2606:4700:4700::1111]/cat.png", "https://8.8.8.8/cat.png"):
        completion = edge.openai().chat.completions.create(model=MODEL, messages=openai_turn(url))
        assert completion.choices[0].message.content
    inline = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}
    message = edge.anthropic().messages.create(model=MODEL, max_tokens=8, messages=[
        {"role": "user", "content": [image(PUBLIC), inline]}])  # fmt: skip
    assert message.stop_reason == "end_turn"
    message = edge.anthropic().messages.create(model=MODEL, max_tokens=8, messages=tool_result_turns(PUBLIC))
    assert message.content
    assert edge.reached() == before + 6

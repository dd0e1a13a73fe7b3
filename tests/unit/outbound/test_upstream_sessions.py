"""The container owns the upstream sessions: one per upstream address, opened in the running
loop by `init_resources()` and closed by `shutdown_resources()`; the clients use them."""

from __future__ import annotations

from bootstrap import Container
from config import load_config_text

CONFIG = """
[server]
listen = "127.0.0.1:8080"

[upstreams.reasoning]
url = "http://127.0.0.1:9"
models = ["reasoning"]

[upstreams.qwen]
url = "https://127.0.0.1:10"
models = ["qwen"]
"""


async def test_sessions_open_with_the_resources_and_close_with_them() -> None:
    container = Container(config=load_config_text(CONFIG))
    clients = container.upstreams()  # made before the loop runs anything: no session yet
    sessions = container.sessions()
    assert sorted(clients) == ["qwen", "reasoning"] and sessions == {}
    await container.init_resources()  # type: ignore[misc]
    opened = dict(sessions)
    assert sorted(opened) == ["qwen", "reasoning"]
    assert opened["qwen"] is not opened["reasoning"] and not any(s.closed for s in opened.values())
    await container.shutdown_resources()  # type: ignore[misc]
    assert all(s.closed for s in opened.values()) and sessions == {}

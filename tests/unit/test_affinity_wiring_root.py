"""The composition root's affinity store: none when no upstream uses affinity, this process's with
the memory backend, the shared one (the gate's Redis and key prefix) with the Redis backend; the
services get the upstreams that use it (`[endpoints]` and `affinity = "prefix"`)."""

from __future__ import annotations

import bootstrap
from adapters.outbound.memory_affinity import MemoryAffinityStore
from config import load_config_text

UPSTREAMS = """
[upstreams.up]
url = "http://127.0.0.1:9"
models = ["m"]
[upstreams.up.admission]
sequence_slots = 8
max_in_flight = 6
queue_depth = 2
queue_timeout_seconds = 5
[upstreams.up.endpoints]
urls = ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
sequence_slots = 4
max_in_flight = 4
{extra}
[upstreams.plain]
url = "http://127.0.0.1:10"
models = ["p"]
"""


def test_the_store_follows_the_backend_and_only_affinity_upstreams_use_it() -> None:
    config = load_config_text(UPSTREAMS.format(extra="affinity_max_extra_in_flight = 2"))
    assert bootstrap._affinity_upstreams(config) == {"up": 2}
    assert isinstance(bootstrap._affinity_store(config), MemoryAffinityStore)
    off = load_config_text(UPSTREAMS.format(extra='affinity = "off"'))
    assert bootstrap._affinity_upstreams(off) == {} and bootstrap._affinity_store(off) is None
    shared = load_config_text('[admission]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:6379/0"\n'
                              'key_prefix = "affinity-unit"\n' + UPSTREAMS.format(extra=""))
    from adapters.outbound.redis_affinity import RedisAffinityStore

    store = bootstrap._affinity_store(shared)
    assert isinstance(store, RedisAffinityStore) and store._prefix == "affinity-unit"
    container = bootstrap.Container(config=config)
    assert container.affinity().wanted("up") and not container.affinity().wanted("plain")
    assert container.service()._affinity is container.completions()._affinity is container.affinity()

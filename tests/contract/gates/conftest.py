"""A 3-master Redis Cluster on loopback for the contract suites' `cluster` variant: started
once per session on free ports (`redis-cli --cluster create`), stopped at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.redis_cluster import RedisCluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

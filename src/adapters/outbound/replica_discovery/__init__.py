"""`ReplicaDiscovery` adapters: fixed `urls`, and `dns` (A/AAAA records re-resolved in the background),
and `ReplicaWatch`, which runs one per upstream for the app's life.

`DnsReplicas` lives in `.dns_records` and is not imported here: dnspython costs about 2.4 MB of
memory in every process, and only an upstream with `[endpoints] dns` needs it."""

from .static import StaticReplicas
from .watch import ReplicaWatch

__all__ = ["ReplicaWatch", "StaticReplicas"]

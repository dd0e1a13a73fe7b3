"""`ReplicaDiscovery` adapters: fixed `urls`, and `dns` (A/AAAA records re-resolved in the background),
and `ReplicaWatch`, which runs one per upstream for the app's life."""

from .dns_records import DnsReplicas
from .static import StaticReplicas
from .watch import ReplicaWatch

__all__ = ["DnsReplicas", "ReplicaWatch", "StaticReplicas"]

"""`ReplicaDiscovery` adapters: fixed `urls`, and `dns` (A/AAAA records re-resolved in the background)."""

from .dns_records import DnsReplicas
from .static import StaticReplicas

__all__ = ["DnsReplicas", "StaticReplicas"]

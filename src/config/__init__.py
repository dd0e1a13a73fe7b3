"""The gateway's configuration file (TOML), decoded and checked with msgspec.

Admission limits have no defaults: an operator must say how many slots an upstream
has. Operational knobs have documented defaults (docs/operations.md), so a file with
only the keys shown in the README is complete. Every mistake raises `ConfigError`
with a message that names the key.

One module per concern: `server` ([server]), `upstreams` ([upstreams.NAME] and its
admission and endpoints tables), `admission` ([admission]: the ledger's backend), `auth`,
`observability` ([ops], [telemetry]), `addresses` (HOST:PORT values), `section` (what
every table shares) and `file` (the root table, loading, checking, printing). What the
rest of the gateway uses is exported here.
"""

from config.addresses import nameserver, parse_listen
from config.admission import SharedAdmissionConfig
from config.auth import AuthConfig
from config.file import Config, dump_config, load_config, load_config_text, parse_ops_listen
from config.observability import OpsConfig, TelemetryConfig
from config.section import ConfigError
from config.server import ServerConfig
from config.upstreams import AdmissionTable, EndpointsTable, UpstreamConfig

__all__ = [
    "AdmissionTable",
    "AuthConfig",
    "Config",
    "ConfigError",
    "EndpointsTable",
    "OpsConfig",
    "ServerConfig",
    "SharedAdmissionConfig",
    "TelemetryConfig",
    "UpstreamConfig",
    "dump_config",
    "load_config",
    "load_config_text",
    "nameserver",
    "parse_listen",
    "parse_ops_listen",
]

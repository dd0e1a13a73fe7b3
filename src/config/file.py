"""The whole file: its root table (`Config`), reading and checking it, and printing it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec

from config.addresses import parse_listen
from config.admission import SharedAdmissionConfig, check_redis
from config.auth import AuthConfig
from config.observability import OpsConfig, TelemetryConfig
from config.section import ConfigError, Section
from config.server import ServerConfig, problem_base_url
from config.upstreams import UpstreamConfig, check_upstreams
from redaction import redacted


class Config(Section):
    upstreams: dict[str, UpstreamConfig]
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    admission: SharedAdmissionConfig = msgspec.field(default_factory=SharedAdmissionConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    ops: OpsConfig = msgspec.field(default_factory=OpsConfig)


_PATH = re.compile(r"`\$((?:[.\[][^`]*)?)`")


def _readable(error: msgspec.ValidationError, prefix: str = "") -> str:
    """Turn msgspec's `$.a.b` paths into `a.b` keys under `prefix`."""
    text = str(error)
    field = re.search(r"field `([^`]+)`", text)
    path = _PATH.search(text)
    where = prefix + (path.group(1) if path else "")
    where = where.lstrip(".")
    if field and ("missing required field" in text or "unknown field" in text):
        key = f"{where}.{field.group(1)}" if where else field.group(1)
        what = "missing required key" if "missing" in text else "unknown key"
        return f"{what} '{key}'"
    message = re.sub(r"\s*-\s*at\s*$", "", _PATH.sub("", text)).strip()
    return f"invalid value for '{where}': {message}" if where else message


def parse_ops_listen(config: Config) -> tuple[str, int]:
    return parse_listen(config.ops.listen, "ops.listen", any_port=True)


def _check(config: Config) -> None:
    main = parse_listen(config.server.listen)
    if parse_ops_listen(config) == main:
        raise ConfigError(f"ops.listen must differ from server.listen ('{config.ops.listen}' is both)")
    config.server.problem_base_url = problem_base_url(config.server.problem_base_url)
    check_upstreams(config.upstreams)
    check_redis(config.admission)
    if config.admission.backend == "memory" and config.server.workers > 1:
        raise ConfigError(
            "server.workers > 1 needs admission.backend = 'redis': the in-memory ledger "
            "is only correct in one process"
        )
    if config.auth.mode == "required" and not config.auth.keys_file:
        raise ConfigError("auth.keys_file is required when auth.mode = 'required'")


def load_config_text(text: str) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    if not isinstance(raw.get("upstreams"), dict) or not raw["upstreams"]:
        raise ConfigError("missing required table 'upstreams' (at least one upstream)")
    upstreams: dict[str, UpstreamConfig] = {}
    for name, table in raw.pop("upstreams").items():
        try:
            upstreams[name] = msgspec.convert(table, UpstreamConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(_readable(exc, f"upstreams.{name}")) from None
    try:
        config = msgspec.convert({**raw, "upstreams": {}}, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(_readable(exc)) from None
    config.upstreams = upstreams
    _check(config)
    return config


def load_config(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from None
    return load_config_text(text)


def dump_config(config: Config) -> str:
    """The effective configuration (defaults filled in) as JSON, for check-config; passwords in
    URLs and keys named like secrets are masked (`redaction`)."""
    shown = redacted(msgspec.to_builtins(config))
    return msgspec.json.format(msgspec.json.encode(shown).decode(), indent=2)

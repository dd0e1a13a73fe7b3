"""Fault injection options of the stub upstream: the draws and the command line (no sockets)."""

from __future__ import annotations

import argparse
import random

import pytest

from stub.cli import add_arguments, config_from_args
from stub.faults import KINDS, FaultPicker


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--listen", "127.0.0.1:0", *argv])


def test_one_kind_at_rate_one_is_always_injected() -> None:
    picker = FaultPicker("truncated", 1.0, random.Random(0))
    assert {picker.draw() for _ in range(50)} == {"truncated"}


def test_rate_zero_never_injects() -> None:
    picker = FaultPicker("random", 0.0, random.Random(0))
    assert {picker.draw() for _ in range(50)} == {None}


def test_random_mode_is_seeded_and_picks_every_kind() -> None:
    pickers = [FaultPicker("random", 0.5, random.Random(3)) for _ in range(2)]
    a, b = ([p.draw() for _ in range(400)] for p in pickers)
    assert a == b  # same seed, same faults in the same order
    assert set(a) == {*KINDS, None}
    assert 120 < a.count(None) < 280  # about half


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        FaultPicker("melt", 1.0, random.Random(0))
    with pytest.raises(SystemExit):
        parse("--fault", "melt")


def test_command_line_defaults_and_rate() -> None:
    assert config_from_args(parse()).fault is None
    config = config_from_args(parse("--fault", "http-4xx"))
    assert (config.fault, config.fault_rate) == ("http-4xx", 1.0)
    config = config_from_args(parse("--fault", "random", "--fault-rate", "0.25", "--seed", "9"))
    assert (config.fault, config.fault_rate, config.seed) == ("random", 0.25, 9)
    with pytest.raises(SystemExit):
        config_from_args(parse("--fault-rate", "0.5"))  # a rate needs a kind
    with pytest.raises(SystemExit):
        parse("--fault", "random", "--fault-rate", "2")


def test_fault_after_and_fault_limit_set_up_a_replica_that_goes_bad_or_recovers() -> None:
    def draws(**options: int) -> list[str | None]:
        picker = FaultPicker("die-mid-stream", 1.0, random.Random(0), **options)
        return [picker.draw() for _ in range(4)]

    die = "die-mid-stream"
    assert draws() == [die] * 4
    assert draws(after=1) == [None, die, die, die]  # the first is fine, then every one dies
    assert draws(limit=1) == [die, None, None, None]  # the first dies, the next ones are fine
    assert draws(after=1, limit=2) == [None, die, die, None]
    picker = FaultPicker("die-mid-stream", 0.5, random.Random(3), limit=3)
    assert [picker.draw() for _ in range(200)].count(die) == 3  # the rate draws, the limit stops


def test_die_mid_stream_options_on_the_command_line() -> None:
    config = config_from_args(parse("--fault", "die-mid-stream"))
    assert (config.fault, config.fault_after_tokens, config.fault_limit) == ("die-mid-stream", 4, None)
    config = config_from_args(parse("--fault", "die-mid-stream", "--fault-after-tokens", "0", "--fault-limit", "1"))
    assert (config.fault_after_tokens, config.fault_limit) == (0, 1)
    assert config_from_args(parse("--fault", "random", "--fault-after-tokens", "2")).fault_after_tokens == 2
    with pytest.raises(SystemExit):
        config_from_args(parse("--fault", "truncated", "--fault-after-tokens", "2"))  # no tokens to count there
    with pytest.raises(SystemExit):
        config_from_args(parse("--fault-limit", "1"))  # a limit needs a kind
    with pytest.raises(SystemExit):
        parse("--fault", "die-mid-stream", "--fault-after-tokens", "-1")

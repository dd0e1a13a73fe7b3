"""bench/callgrind.py (cpu_cost.py --cache-sim): valgrind's cache options from /sys, and misses per request
from a dump."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def _level(root: Path, index: int, level: int, kind: str, size: str, ways: int) -> None:
    d = root / f"index{index}"
    d.mkdir()
    for name, value in (("level", level), ("type", kind), ("size", size), ("ways_of_associativity", ways),
                        ("coherency_line_size", 64)):
        (d / name).write_text(f"{value}\n")


def test_the_two_levels_come_from_sys_as_valgrind_options(callgrind: ModuleType, tmp_path: Path) -> None:
    _level(tmp_path, 0, 1, "Data", "48K", 12)
    _level(tmp_path, 1, 1, "Instruction", "64K", 16)
    _level(tmp_path, 2, 2, "Unified", "2048K", 16)
    _level(tmp_path, 3, 3, "Unified", "491520K", 16)  # the last level is not simulated: L2 stands for it
    assert callgrind.cache_levels(tmp_path) == ["--I1=65536,16,64", "--D1=49152,12,64", "--LL=2097152,16,64"]


def test_a_level_valgrind_cannot_model_is_left_to_its_guess(callgrind: ModuleType, tmp_path: Path) -> None:
    _level(tmp_path, 0, 1, "Data", "48K", 16)  # 48 sets: not a power of two
    _level(tmp_path, 2, 2, "Unified", "1280K", 10)  # 2048 sets
    assert callgrind.cache_levels(tmp_path) == ["--LL=1310720,10,64"]
    assert callgrind.cache_levels(tmp_path / "absent") == []


def test_misses_per_request_from_the_dump_summary(callgrind: ModuleType, tmp_path: Path) -> None:
    dump = tmp_path / "callgrind.out"
    dump.write_text("version: 1\nevents: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
                    "summary: 4000 900 500 40 60 20 4 8 12\nfl=(1) x\n")
    events = callgrind.events_of(dump)
    assert events["Ir"] == 4000 and events["DLmw"] == 12
    row = callgrind.misses(events, 4)
    assert row == {"I1mr": 10.0, "D1mr": 15.0, "D1mw": 5.0, "ILmr": 1.0, "DLmr": 2.0, "DLmw": 3.0, "L1": 30.0,
                   "L2": 6.0}

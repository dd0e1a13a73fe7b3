"""valgrind's callgrind on a target process: instructions (and, simulated, cache misses) for
exactly the requests of a measured run.

The target starts under `valgrind --tool=callgrind` with instrumentation off, so its start-up
and warm-up are not counted; `callgrind_control` switches it on and zeroes the counters just
before the measured run and dumps them right after. The counts are the target's own user-space
instructions: exact, and the same on a busy machine as on an idle one (the kernel's share of a
send or a read is not in them). A dump opens with `callgrind_annotate` for the C-level split.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path


def cache_levels(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> list[str]:
    """valgrind's `--I1`, `--D1` and `--LL` options for this CPU's L1 and L2 (`size,ways,line`);
    a level valgrind cannot model (its sets not a power of two) or that /sys does not tell is
    left to valgrind's own guess."""
    flags: dict[str, str] = {}
    for index in sorted(sysfs.glob("index*")):
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
            ways = int((index / "ways_of_associativity").read_text())
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        octets = int(size[:-1]) * {"K": 1024, "M": 1024 * 1024}[size[-1]] if size[-1] in "KM" else int(size)
        sets = octets // max(ways * line, 1)
        if ways <= 0 or sets <= 0 or sets & (sets - 1):
            continue
        name = {("1", "Data"): "D1", ("1", "Instruction"): "I1", ("2", "Unified"): "LL"}.get((level, kind))
        if name:
            flags[name] = f"--{name}={octets},{ways},{line}"
    return [flags[name] for name in ("I1", "D1", "LL") if name in flags]


def events_of(dump: Path) -> dict[str, int]:
    """A callgrind dump's totals by event (`events:` names the `summary:` or `totals:` numbers);
    empty while the dump is not complete."""
    names: list[str] = []
    with dump.open(errors="replace") as lines:
        for line in lines:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith(("summary:", "totals:")):
                return dict(zip(names, map(int, line.split()[1:]), strict=False))
    return {}


class Callgrind:
    """callgrind_control on the target: instrumentation on, counters zeroed, dumped."""

    def __init__(self, workdir: Path, cache_sim: bool = False) -> None:
        self.workdir = workdir
        self.control = shutil.which("callgrind_control") or "callgrind_control"
        self.cache = ("--cache-sim=yes", *cache_levels()) if cache_sim else ()

    def wrap(self) -> tuple[str, ...]:
        # --trace-children: a BENCH_GATEWAY_PYTHON that is a wrapper re-executing an interpreter
        # is still measured
        return ("valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no", "--trace-children=yes",
                *self.cache, f"--callgrind-out-file={self.workdir}/callgrind.out.%p")

    def _run(self, *args: str) -> None:
        subprocess.run([self.control, *args], check=True, capture_output=True, timeout=120)

    def begin(self, pid: int) -> None:
        self._run("-i", "on", str(pid))
        self._run("-z", str(pid))

    def end(self, pid: int) -> tuple[dict[str, int], Path]:
        """The dump's totals by event (`Ir`: instructions) and the dump."""
        before = set(self.workdir.glob(f"callgrind.out.{pid}*"))
        self._run("-d", str(pid))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for path in set(self.workdir.glob(f"callgrind.out.{pid}*")) - before:
                events = events_of(path)
                if events:
                    return events, path
            time.sleep(0.2)
        raise RuntimeError("callgrind wrote no dump")


def split(dump: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Self instructions per shared object and per C function of a callgrind dump (the
    inclusive cost line after each `calls=` is skipped)."""
    names: dict[str, dict[str, str]] = {"ob": {}, "fl": {}, "fn": {}}  # one id space each
    by_object: dict[str, int] = {}
    by_function: dict[str, int] = {}

    def name(space: str, spec: str) -> str:  # "(id) name" defines an id, "(id)" refers to it
        spec = spec.strip()
        if spec.startswith("("):
            ident, _, rest = spec.partition(")")
            if rest.strip():
                names[space][ident] = rest.strip()
            return names[space].get(ident, spec)
        return spec

    spaces = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl",
              "cfl": "fl"}
    obj = fn = "?"
    skip = False
    with dump.open(errors="replace") as lines:
        for line in lines:
            key, eq, rest = line.partition("=")
            if eq and key in spaces:
                value = name(spaces[key], rest)
                if key == "ob":
                    obj = value
                elif key == "fn":
                    fn = value
            elif key == "calls" and eq:
                skip = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:  # the inclusive cost of the call just named, not this function's own
                    skip = False
                    continue
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    cost = int(parts[1])
                    by_object[obj] = by_object.get(obj, 0) + cost
                    label = f"{fn} [{Path(obj).name}]"
                    by_function[label] = by_function.get(label, 0) + cost
    return by_object, by_function


def misses(events: dict[str, int], per: int) -> dict[str, float]:
    """Cache misses per request: the first level's (instructions, data read, data written), L2's
    (the simulation's last level) and their sums."""
    row = {name: round(events.get(name, 0) / per, 1) for name in ("I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")}
    row["L1"] = round(row["I1mr"] + row["D1mr"] + row["D1mw"], 1)
    row["L2"] = round(row["ILmr"] + row["DLmr"] + row["DLmw"], 1)
    return row

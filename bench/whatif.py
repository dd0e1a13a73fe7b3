#!/usr/bin/env python3
"""What would a change save? Run the gateway with a cost removed, for measurement only.

    BENCH_GATEWAY_PYTHON=bench/whatif.py WHATIF=no-guard-copy,gc-threshold \\
        .venv/bin/python bench/cpu_cost.py --target ours --scenario v1-stream --callgrind

The CPU profile of the request path used this to put a figure on each proposed change before
anyone wrote it: each name below removes (or stubs out) one per-request cost at import time, so
`cpu_cost.py --callgrind` can count the instructions that cost takes. A patched gateway is
NOT a correct gateway (a removed timeout no longer times out, a removed trace hook no longer
detects a reused connection): never serve with it, never read anything but its cost. Some
patches reach into Litestar or aiohttp internals to remove a cost; that is allowed here
only because nothing here is the product. The real change must do the same work within the
stack's public API, so the saving measured is an upper bound for it.

It stands in for the gateway's interpreter as bench/targets.py runs it (`-m bootstrap serve
...`): `BENCH_GATEWAY_PYTHON` points at this file, which re-executes itself on the runtime
venv's interpreter (bench/.venv-runtime, built by bench/run) when that exists.
`cpu_cost.py --callgrind` follows that exec (valgrind `--trace-children=yes`). Given a
script instead (the ceiling: `peers.ceiling_python()` resolves to this too), only
`gc-threshold`, `no-gc`, `gc-report`, `loop-lag`, `cprofile` and `opcodes` apply.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "bench" / ".venv-runtime" / "bin" / "python"


def _no_guard_copy() -> None:
    """Litestar copies the route handler for every guard call: run the guards without it
    (what the header-size and key checks cost once they live in the Router's middleware)."""
    from litestar.handlers.base import BaseRouteHandler

    async def authorize_connection(self: Any, connection: Any) -> None:
        for guard in self.resolve_guards():
            await guard(connection, self)

    BaseRouteHandler.authorize_connection = authorize_connection  # type: ignore[method-assign]


def _no_trace() -> None:
    """aiohttp's trace hook on every request (only to notice a reused connection)."""
    import types

    import adapters.outbound.openai_compat.session as session

    original = session.aiohttp.ClientSession

    def plain(*args: Any, trace_configs: Any = None, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    session.aiohttp = types.SimpleNamespace(**{**vars(session.aiohttp), "ClientSession": plain})


def _no_lease_watch() -> None:
    """`_unless_lost`: two tasks and an asyncio.wait per non-streaming call."""
    import application.chat as chat

    async def unless_lost(call: Any, lost: asyncio.Event) -> Any:
        return await call

    chat._unless_lost = unless_lost


def _no_read_timeout() -> None:
    """The bound on every upstream body read (an `asyncio.timeout` per read at first,
    one lazy timer per response now: `BodyReader`)."""
    from adapters.outbound.openai_compat.body_reader import BodyReader

    async def read(self: Any) -> bytes:
        return await self._resp.content.readany()  # type: ignore[no-any-return]

    BodyReader.read = read  # type: ignore[method-assign]


def _no_body_timeout() -> None:
    """An `asyncio.timeout` object around reading the request body."""
    import adapters.inbound._shared.bodies as bodies

    async def read_body(request: Any, timeout: float | None) -> bytes:
        return await request.body()  # type: ignore[no-any-return]

    bodies.read_body = read_body
    import adapters.inbound.anthropic.controller as llm
    import adapters.inbound.openai.controller as v1

    v1.read_body = llm.read_body = read_body


def _no_watch() -> None:
    """The hang-up watcher's timer (and task, for slow requests) per request."""
    from adapters.inbound._shared.call import Call

    Call.watch = lambda self: None  # type: ignore[method-assign]


def _no_metrics() -> None:
    """The Prometheus children updated per request."""
    from adapters.outbound.prometheus_metrics import PrometheusMetrics

    PrometheusMetrics.request_finished = lambda self, record, handle=None: None  # type: ignore[method-assign]


def _break_cycles() -> None:
    """The reference cycles each request leaves for the cyclic GC (the ceiling leaves none):
    the `Call` in the scope's state holds the cycle's `receive` and the task; `/llm`'s
    `_frames` keeps the finished item task, whose StopAsyncIteration's traceback holds
    `_frames`' own frame (and with it the request's objects)."""
    import adapters.inbound._shared.edge as edge
    from adapters.inbound._shared.call import CALL_KEY

    call_middleware = edge.EdgeMiddleware.__call__

    async def middleware(self: Any, scope: Any, receive: Any, send: Any) -> None:
        try:
            await call_middleware(self, scope, receive, send)
        finally:
            call = scope.get("state", {}).pop(CALL_KEY, None)
            if call is not None:
                call._receive = call._task = call._watcher = None
                call.body = None

    edge.EdgeMiddleware.__call__ = middleware  # type: ignore[method-assign]

    import inspect

    import adapters.inbound.anthropic.controller as llm

    source = inspect.getsource(llm._frames)
    old = "                    except StopAsyncIteration:\n                        break\n"
    assert old in source, "whatif: anthropic _frames changed; update break-cycles"
    clear = "task = done = None\n"
    source = source.replace(old, f"                    except StopAsyncIteration:\n                        {clear}"
                                 f"                        break\n                    {clear}")
    exec(compile(source, llm.__file__, "exec"), llm.__dict__)


def _gc_threshold() -> None:
    """The cyclic GC's first generation collected every 10,000 allocations, not 700."""
    gc.set_threshold(int(os.environ.get("WHATIF_GEN0", "10000")), 10, 10)


def _no_gc() -> None:
    gc.disable()


def _gc_report() -> None:
    """Keep what the cyclic GC frees (`gc.DEBUG_SAVEALL`); on SIGUSR1 collect and write the
    kinds of objects found in cycles since the last report to $WHATIF_GC_REPORT (default
    bench/out/gc-report.txt), then forget them: send it once after a warm-up, once after a
    bounded load, and read what each request leaves to the GC."""
    import collections
    import signal

    gc.set_debug(gc.DEBUG_SAVEALL)
    path = Path(os.environ.get("WHATIF_GC_REPORT", str(ROOT / "bench" / "out" / "gc-report.txt")))

    def report(*_: Any) -> None:
        gc.collect()
        kinds = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
        frames = collections.Counter(f"{o.f_code.co_qualname} ({o.f_code.co_filename.rsplit('/', 3)[-1]})"
                                     for o in gc.garbage if type(o).__name__ == "frame")
        lines = [f"{len(gc.garbage)} objects in cycles", *(f"{n:8d} {k}" for k, n in kinds.most_common(40)),
                 "frames:", *(f"{n:8d} {k}" for k, n in frames.most_common(20))]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        gc.garbage.clear()

    signal.signal(signal.SIGUSR1, report)


def _loop_lag() -> None:
    """Sample the event loop's lateness every millisecond (a task sleeping 1 ms, started with
    uvicorn's server); on SIGUSR2 write `time lateness_ms` per late wake-up (> 1 ms) to
    $WHATIF_LAG_FILE and forget them: how long a wave of new requests holds the loop."""
    import signal
    import time

    import uvicorn

    late: list[tuple[float, float]] = []
    path = Path(os.environ.get("WHATIF_LAG_FILE", str(ROOT / "bench" / "out" / "loop-lag.txt")))

    async def probe() -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lateness = time.perf_counter() - t0 - 0.001
            if lateness > 0.001:
                late.append((t0, lateness * 1000))

    def dump(*_: Any) -> None:
        path.write_text("".join(f"{t:.4f} {ms:.2f}\n" for t, ms in late))
        late.clear()

    original = uvicorn.Server.serve

    probing: list[bool] = []

    async def serve(self: Any, sockets: Any = None) -> None:
        if probing:  # the gateway's ops listener is a second server on the same loop: one probe
            await original(self, sockets)
            return
        probing.append(True)
        task = asyncio.get_running_loop().create_task(probe())
        try:
            await original(self, sockets)
        finally:
            task.cancel()

    uvicorn.Server.serve = serve  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR2, dump)


def _cprofile() -> None:
    """cProfile on the main thread (the event loop's), switched by SIGUSR1: the first signal
    starts a fresh profile, the next writes it (pstats format) to $WHATIF_PROFILE_FILE (default
    bench/out/cprofile.pstats) and stops. `cpu_cost.py --cprofile` sends both around its
    measured run: Python function calls per request, ours against the ceiling's."""
    import cProfile
    import signal

    path = Path(os.environ.get("WHATIF_PROFILE_FILE", str(ROOT / "bench" / "out" / "cprofile.pstats")))
    running: list[cProfile.Profile] = []

    def toggle(*_: Any) -> None:
        if running:
            profile = running.pop()
            profile.disable()
            path.parent.mkdir(parents=True, exist_ok=True)
            profile.dump_stats(str(path))
        else:
            running.append(cProfile.Profile())
            running[0].enable()

    signal.signal(signal.SIGUSR1, toggle)


def _opcodes() -> None:
    """Python opcodes executed per code object on the main thread, switched by SIGUSR1 like
    `cprofile`: the first signal starts counting, the next writes the counts (JSON, keyed
    `file:first line:name`) to $WHATIF_OPCODES_FILE (default bench/out/opcodes.json) and stops.
    `cpu_cost.py --opcodes` sends both around its measured run. Exact where a profile is not:
    the bytecode each function runs per request, ours against the ceiling's (very slow: a
    trace call per opcode)."""
    import collections
    import json
    import signal
    from types import FrameType

    path = Path(os.environ.get("WHATIF_OPCODES_FILE", str(ROOT / "bench" / "out" / "opcodes.json")))
    counts: collections.Counter[str] = collections.Counter()
    on: list[bool] = []

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"

        def count(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[key] += 1
            return count

        return count

    def toggle(*_: Any) -> None:
        if on:
            on.clear()
            sys.settrace(None)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(counts))
        else:
            on.append(True)
            counts.clear()
            sys.settrace(trace)  # frames entered or resumed from now on

    signal.signal(signal.SIGUSR1, toggle)


def _no_mapping() -> None:
    """An upper bound on what mapping a `/v1` stream costs: a read of a whole answer (role to
    `[DONE]`, as the bench's c64 load reads it) becomes one chunk without looking at its frames:
    fixed canonical events, the frames before the usage one relayed as one slice. Any other
    read is mapped as usual."""
    from adapters.outbound.openai_compat import stream_mapping as sm
    from domain.canonical import Finish, MessageStart, NativePayload, StreamChunk, TextRun, Usage, UsageReport

    mapped = sm.StreamMapper.feed_events

    def feed_events(self: Any, data: bytes) -> Any:
        usage = data.rfind(b"\n\ndata: {", 0, len(data) - 16)  # the usage frame's start (the gateway asks for it)
        if self.phase is not sm.Phase.IDLE or not data.endswith(b"data: [DONE]\n\n") or usage < 0:
            return mapped(self, data)
        cut = usage + 2
        self.phase = sm.Phase.DONE
        events = [MessageStart(id="x", model="m", created=1), TextRun(texts=["a"] * 20),
                  Finish(reason="end_turn"), UsageReport(usage=Usage(input_tokens=1, output_tokens=20))]
        return [StreamChunk(events=events, native=NativePayload(format=sm.TOKEN_FRAMES_FORMAT, data=data[:cut]))]

    sm.StreamMapper.feed_events = feed_events  # type: ignore[method-assign]


PATCHES = {
    "no-guard-copy": _no_guard_copy, "no-trace": _no_trace, "no-lease-watch": _no_lease_watch,
    "no-read-timeout": _no_read_timeout, "no-body-timeout": _no_body_timeout, "no-watch": _no_watch,
    "no-metrics": _no_metrics, "break-cycles": _break_cycles, "gc-threshold": _gc_threshold, "no-gc": _no_gc,
    "gc-report": _gc_report, "loop-lag": _loop_lag, "cprofile": _cprofile, "opcodes": _opcodes,
    "no-mapping": _no_mapping,
}


def main() -> int:
    if Path(sys.prefix) != RUNTIME.parents[1] and RUNTIME.exists() and not os.environ.get("WHATIF_EXEC"):
        os.environ["WHATIF_EXEC"] = "1"  # once: on the runtime venv's interpreter
        os.execv(str(RUNTIME), [str(RUNTIME), __file__, *sys.argv[1:]])
    if sys.argv[1:3] == ["-c", "import aiohttp"]:  # peers.ceiling_python() asking
        import aiohttp  # noqa: F401

        return 0
    wanted = [w for w in os.environ.get("WHATIF", "").split(",") if w]
    unknown = set(wanted) - set(PATCHES)
    if unknown:
        raise SystemExit(f"whatif: unknown {sorted(unknown)}; known: {', '.join(PATCHES)}")
    if sys.argv[1:3] != ["-m", "bootstrap"]:  # a script (the ceiling): the GC settings, the probe, the profiler
        import runpy

        for name in set(wanted) & {"gc-threshold", "no-gc", "gc-report", "loop-lag", "cprofile", "opcodes"}:
            PATCHES[name]()
        sys.argv = sys.argv[1:]
        sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    for name in wanted:
        PATCHES[name]()
    sys.argv = ["bootstrap", *sys.argv[3:]]
    import bootstrap

    return bootstrap.main()


if __name__ == "__main__":
    sys.exit(main())

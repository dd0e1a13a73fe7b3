"""Run the gateway with the test tree's third dialect added to the real ones.

    python tests/contract/admission/serve_with_third_dialect.py --config PATH

The dialect is registered through the same point bootstrap uses for `/v1` and `/llm`
(`build_app(config, dialects=[*DIALECTS, third.router])`). The app is the one `gateway serve`
builds; the server around it is plain uvicorn (no SIGTERM drain, no server-level extras), with
the ops listener beside it (`serving.OpsServer`) for the metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # third_dialect.py; src/ comes on PYTHONPATH
sys.path.insert(1, str(HERE.parents[2] / "src"))


def main() -> None:
    import uvicorn
    from third_dialect import router

    import bootstrap
    import serving
    from config import load_config, parse_listen, parse_ops_listen

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    config = load_config(parser.parse_args().config)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)  # as `gateway serve`
    app = bootstrap.build_app(config, dialects=[*bootstrap.DIALECTS, router])
    host, port = parse_listen(config.server.listen)
    ops_host, ops_port = parse_ops_listen(config)
    ops_socket = serving.listen_socket(ops_host, ops_port)  # the ops listener, as `gateway serve` runs it
    print(f"gateway ops listening on http://{ops_host}:{ops_socket.getsockname()[1]}", file=sys.stderr, flush=True)
    main_server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, loop="uvloop", http="httptools",
                                                lifespan="on", access_log=False, log_level="warning"))
    ops_app = app.app.state.container.ops_app()  # app.app: the Litestar app inside the edge middleware
    ops_server = serving.OpsServer(uvicorn.Config(ops_app, lifespan="off", log_level="warning"))

    async def both() -> None:
        ops = asyncio.create_task(ops_server.serve(sockets=[ops_socket]))
        try:
            await main_server.serve()
        finally:
            ops_server.should_exit = True
            await ops

    asyncio.run(both())


if __name__ == "__main__":
    main()

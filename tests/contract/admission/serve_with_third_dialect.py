"""Run the gateway with the test tree's third dialect added to the real ones.

    python tests/contract/admission/serve_with_third_dialect.py --config PATH

The dialect is registered through the same point bootstrap uses for `/v1` and `/llm`
(`build_app(config, dialects=[*DIALECTS, third.router])`). The app is the one `gateway serve`
builds; the server around it is plain uvicorn (no SIGTERM drain, no server-level extras).
"""

from __future__ import annotations

import argparse
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
    from config import load_config, parse_listen

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    config = load_config(parser.parse_args().config)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)  # as `gateway serve`
    app = bootstrap.build_app(config, dialects=[*bootstrap.DIALECTS, router])
    host, port = parse_listen(config.server.listen)
    uvicorn.run(app, host=host, port=port, loop="uvloop", http="httptools", lifespan="on",
                access_log=False, log_level="warning")


if __name__ == "__main__":
    main()

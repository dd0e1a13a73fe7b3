"""``python -m stub --listen HOST:PORT ...``: the same as ``gateway stub``."""

import argparse
import sys

from stub.cli import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m stub", description=run.__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())

"""The `bertforge` program (`start`), also as `python -m bertforge` and `torchrun -m bertforge`.

This module imports nothing at its top: the command-line interface imports torch, which takes seconds,
and a Ctrl-C meanwhile ends the program with one line instead of a traceback from inside torch.
"""

import sys

INTERRUPTED_WHILE_STARTING = "bertforge: interrupted by Ctrl-C while starting; nothing was done"


def start() -> int:
    try:
        from bertforge.cli import run
    except KeyboardInterrupt:
        print(INTERRUPTED_WHILE_STARTING, file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    raise SystemExit(start())

"""The `bertforge` program (`start`), also as `python -m bertforge` and `torchrun -m bertforge`.

The command-line interface imports torch, which takes seconds. A Ctrl-C or SIGTERM meanwhile is held
until the imports end, then ends the program with one line: acted on inside them, it could leave a
module half-imported (numpy without `matrix`, seen) and the command running on, or print a traceback
from inside torch.
"""

import signal
import sys


def start() -> int:
    try:
        from bertforge.signals import StopSignals

        with StopSignals() as signals:
            from bertforge.cli import run
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the signals were held
        return stopped_while_starting("interrupted by Ctrl-C", 130)
    if signals.received:
        how = "interrupted by Ctrl-C" if signals.received == signal.SIGINT else "stopped by SIGTERM"
        return stopped_while_starting(how, 128 + signals.received)
    return run()


def stopped_while_starting(how: str, status: int) -> int:
    print(f"bertforge: {how} while starting; nothing was done", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(start())

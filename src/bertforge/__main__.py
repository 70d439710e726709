"""`python -m bertforge` (and `torchrun -m bertforge`) runs the command-line interface."""

from bertforge.cli import run

if __name__ == "__main__":
    raise SystemExit(run())

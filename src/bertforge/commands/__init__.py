"""Command groups of the `bertforge` CLI; each module has `register(subparsers)`."""

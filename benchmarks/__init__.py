"""bertforge's benchmark suite: `make bench` or `python -m benchmarks.run` (see benchmarks/README.md)."""

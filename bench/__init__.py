"""Benchmarks: `make bench`. Never part of `make test`."""

"""Process harnesses: real node processes on 127.0.0.1 for tests, benchmarks and demos.

Its own source root (`harness/`), so that the node never carries what starts it for a test, and
outside the wheel: nothing shipped uses it.
"""

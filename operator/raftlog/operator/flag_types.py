"""Command-line value types shared by `kubectl raft` and `raftctl`: one wording for each refusal,
which argparse prints after the flag's name."""

from __future__ import annotations

import argparse
import math


def positive_seconds(text: str) -> float:
    """A timeout: a finite number of seconds above 0 (nan, inf, 0 and below refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: the timeout must be positive")
    return value

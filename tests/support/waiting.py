"""Waiting on state in tests: poll a check until it holds or its bound passes, then fail saying what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(what: str, check: Callable[[], object], bound_s: float, details: Callable[[], str] = str,
               poll_s: float = 0.5):  # fmt: skip
    """The check's first truthy value within ``bound_s``; else the test fails naming ``what`` and ``details()``."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    pytest.fail(f"not within {bound_s}s: {what}\n{details()}")

"""One way for a filter plugin to turn its own error (a ValueError subclass whose message names the variable and
the fix) into Ansible's filter error, so the pure-Python filter functions stay testable without Ansible. Controller
code (filters), so in plugin_utils: module_utils is what modules carry to the hosts."""

from __future__ import annotations

import functools


def as_filter_error(func, errors: type[Exception], prefix: str | None = None):
    """``func`` for a FilterModule: an ``errors`` exception becomes AnsibleFilterError "<prefix>: <message>"
    (prefix: the function's name when not given); anything else passes through."""

    @functools.wraps(func)
    def inner(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except errors as exc:
            from ansible.errors import AnsibleFilterError  # noqa: PLC0415 (only when a filter fails)

            raise AnsibleFilterError(f"{prefix or func.__name__}: {exc}") from exc

    return inner

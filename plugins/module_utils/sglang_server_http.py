"""HTTP calls of the sglang_server modules to the SGLang server (and the fleet router): ``http`` gives
``(status, body_text, seconds)``, status 0 when there is no HTTP answer.
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request


def http(method, url, body=None, headers=None, timeout=30):
    """``(status, body_text, seconds)``; status 0 with the error text when there is no HTTP answer."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
            return resp.status, text, time.monotonic() - started
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace") if exc.fp else ""
        return exc.code, text, time.monotonic() - started
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, str(reason), time.monotonic() - started

"""HTTP calls of the sglang_server modules to the SGLang server (and the fleet router): ``http`` gives
``(status, body_text, seconds)``, status 0 when there is no HTTP answer.
Through ansible-core's module_utils.urls (``http_request.open_url``); unit-tested against a local server.
"""

from __future__ import annotations

import json
import time
import urllib.error

from ansible_collections.gpufleet.fleet.plugins.module_utils.http_request import open_url
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_files import read_env_file


def http(method, url, body=None, headers=None, timeout=30):
    """``(status, body_text, seconds)``; status 0 with the error text when there is no HTTP answer."""
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Accept": "application/json"}
    if data is not None:
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    started = time.monotonic()
    try:
        with open_url(url, data=data, headers=sent, method=method, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
            return resp.status, text, time.monotonic() - started
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace") if exc.fp else ""
        return exc.code, text, time.monotonic() - started
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, str(reason), time.monotonic() - started


def server_api(p, options, no_log_values=None):
    """What a module needs to call the server: ``p`` with its missing ``options`` (an argument spec) at their
    defaults, the base URL (``p['base_url']``, no trailing ``/``) and the request headers, with the API key given
    (``p['api_key']``) or read from the host's secrets file (``p['secrets_file']``, SGLANG_SERVER_API_KEY) as a
    Bearer token. The key goes to ``no_log_values``: it never reaches a result or a log."""
    p = {**{k: v.get("default") for k, v in options.items()}, **p}
    api_key = p["api_key"] or read_env_file(p["secrets_file"]).get("SGLANG_SERVER_API_KEY", "")
    if api_key and no_log_values is not None:
        no_log_values.add(api_key)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return p, p["base_url"].rstrip("/"), headers

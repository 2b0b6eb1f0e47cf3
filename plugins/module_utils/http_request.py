"""The modules' one way to open a URL: ansible-core's ``module_utils.urls``, set up as urllib's default opener was.

ansible-core's proxy and certificate handling, and what urllib's opener did here before: no ``.netrc`` credentials,
no gzip decoding (a mirror's byte counts stay the server's), and one TLS context per process (``open_url`` builds a
new one for every request, reading the system's CA files each time, which a polling loop would pay at every poll)."""

from __future__ import annotations

from ansible.module_utils.urls import Request, make_context

_REQUEST = []


def open_url(url, data=None, headers=None, method=None, timeout=30):
    """The response (``with``-able, an ``http.client.HTTPResponse``); ``urllib.error.HTTPError`` for an HTTP error
    status, ``urllib.error.URLError`` or ``OSError`` when there is no HTTP answer, as with urllib itself."""
    if not _REQUEST:
        _REQUEST.append(Request(decompress=False, use_netrc=False, context=make_context()))
    return _REQUEST[0].open(method or ("POST" if data is not None else "GET"), url, data=data,
                            headers=dict(headers or {}), timeout=timeout)  # fmt: skip

"""SGLang's HTTP API on stdlib ``http.server`` (HTTP/1.1, keep-alive, chunked SSE streaming)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from . import SERVER_VERSION, SIM_HEADER, SIM_HEADER_VALUE
from .engine import ClientGone, Result
from .log import log
from .quiet_http import DisconnectQuietHTTPServer
from .textgen import StreamingReasoningParser, parse_reasoning

if TYPE_CHECKING:
    from .app import App

EOS_TOKEN_ID = 151329  # reported as "matched" stop token


class BadRequest(Exception):
    pass


def model_thinks(body: dict) -> bool:
    """The simulated model is a thinking model (like GLM-5): a chat answer starts with ``<think>...</think>``
    unless the request turns thinking off in its chat template (``chat_template_kwargs``: ``enable_thinking``
    or ``thinking`` false, as GLM/Qwen templates then pre-fill an empty think block)."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        return True
    return kwargs.get("enable_thinking") is not False and kwargs.get("thinking") is not False


def reasoning_from_request(parser: str, body: dict) -> bool:
    """sglang 0.5.9 ``OpenAIServingChat._get_reasoning_from_request`` (the parser's force_reasoning)."""
    kwargs = body.get("chat_template_kwargs")
    if parser == "deepseek-v3":
        return kwargs is not None and kwargs.get("thinking") is True
    if parser == "kimi_k2":
        return not kwargs or kwargs.get("thinking") is not False
    if parser in ("qwen3", "glm45", "nano_v3", "interns1"):
        return not kwargs or kwargs.get("enable_thinking") is not False
    return True


class SimHTTPServer(DisconnectQuietHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr: tuple[str, int], app: App):
        host = addr[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.app = app
        super().__init__(addr, Handler)


def _fake_ids(result: Result) -> list[int]:
    return [1000 + (hash(p) % 50000) for p in result.pieces]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: SimHTTPServer

    # ---------------------------------------------------------------- plumbing
    @property
    def app(self) -> App:
        return self.server.app

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # access lines are written by log_request, errors are not interesting

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if not self.app.access_log_enabled(self.path):
            return
        try:
            status = HTTPStatus(int(code))
            code_text = f"{status.value} {status.phrase}"
        except (ValueError, TypeError):
            code_text = str(code)
        host, port = self.client_address[:2]
        log(f'INFO:     {host}:{port} - "{self.command} {self.path} {self.request_version}" {code_text}')

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        self.send_header(SIM_HEADER, SIM_HEADER_VALUE)
        track = getattr(self, "_track", None)
        if track is not None and not track[3]:
            # track_http_status_code (utils/common.py:1648): counted when call_next returns, i.e. when the
            # response starts (a stream: before its body); the request stops being "active" then too
            track[3] = True
            metrics, endpoint, method, _done, key = track
            metrics.http_response(endpoint, method, code)
            metrics.http_end(endpoint, method, key)

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        if body or code not in (200, 503):
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def send_json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode())

    def send_openai_error(self, code: int, message: str, type_: str = "BadRequestError") -> None:
        self.send_json(code, {"object": "error", "message": message, "type": type_, "param": None, "code": code})

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def read_json(self) -> dict:
        raw = self.read_body()
        if not raw.strip():
            raise BadRequest("Request body is empty; expected a JSON object")
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise BadRequest(f"Invalid JSON body: {e}") from e
        if not isinstance(body, dict):
            raise BadRequest("Expected a JSON object")
        return body

    def authorized(self) -> bool:
        """sglang 0.5.9 ``utils/auth.py`` ``decide_request_auth`` (NORMAL level, api_key set).

        /health* and /metrics* need no key; the header is split once on a space, the scheme compared
        case-insensitively and the key with ``secrets.compare_digest``, which raises TypeError for
        non-ASCII text (the ASGI app then answers 500). Header values arrive latin-1 decoded with the
        surrounding whitespace stripped, as h11/starlette hand them over.
        """
        key = self.app.args.api_key
        path = self.path.split("?", 1)[0]
        if not key or self.command == "OPTIONS" or path.startswith("/health") or path.startswith("/metrics"):
            return True
        header = self.headers.get("Authorization")
        if header is not None:
            header = header.strip(" \t")
        if not header:
            return False
        parts = header.split(" ", 1)
        if len(parts) != 2 or parts[0].lower() != "bearer":
            return False
        return secrets.compare_digest(parts[1], key)

    # ---------------------------------------------------------------- dispatch
    GET_ROUTES = {
        "/health": "health",
        "/health_generate": "health",
        "/v1/models": "models",
        "/get_model_info": "model_info",
        "/model_info": "model_info",
        "/get_server_info": "server_info",
        "/server_info": "server_info",
        "/metrics": "metrics",
        "/v1/loads": "loads",
    }
    POST_ROUTES = {
        "/generate": "generate",
        "/v1/completions": "completions",
        "/v1/chat/completions": "chat",
    }

    def _dispatch(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            allowed = self.authorized()
        except TypeError:  # compare_digest and a non-ASCII key, as in 0.5.9's middleware: uvicorn answers 500
            log(f"ERROR:    Exception in ASGI application\n{traceback.format_exc()}")
            if self.command == "POST":
                self.read_body()
            self.close_connection = True
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        if not allowed:
            if self.command == "POST":
                self.read_body()
            self.send_json(401, {"error": "Unauthorized"})
            return
        metrics = self.app.metrics
        self._track = None
        if metrics is not None:
            # the middleware sits inside the API-key one (added first, http_server.py:1918 vs 1946): requests
            # refused with 401 are not counted. The endpoint is the route's path, else the raw path.
            endpoint = "/metrics" if path.startswith("/metrics") else path
            key = self.headers.get("x-smg-routing-key")
            metrics.http_begin(endpoint, self.command, key)
            self._track = [metrics, endpoint, self.command, False, key]
        try:
            self._route(path)
        finally:
            track, self._track = self._track, None
            if track is not None and not track[3]:
                track[0].http_end(track[1], track[2], track[4])

    def _route(self, path: str) -> None:
        routes = self.GET_ROUTES if self.command in ("GET", "HEAD") else self.POST_ROUTES
        name = routes.get(path)
        if path.startswith("/metrics") and self.app.metrics is not None:
            # Mount("/metrics", make_asgi_app(...)) with path_regex ^/metrics(?P<path>.*)$ (utils/common.py:1577):
            # any method, any path that starts with /metrics
            name = "metrics"
        if name is None:
            if self.command == "POST":
                self.read_body()
            other = self.POST_ROUTES if routes is self.GET_ROUTES else self.GET_ROUTES
            if path in other:
                self.send_json(405, {"detail": "Method Not Allowed"})
            else:
                self.send_json(404, {"detail": "Not Found"})
            return
        try:
            getattr(self, f"h_{name}")()
        except BadRequest as e:
            self.send_openai_error(400, str(e))
        except (BrokenPipeError, ConnectionResetError, ClientGone):
            self.close_connection = True
        except Exception:  # a simulator bug: answer 500 like uvicorn, keep serving
            log(f"ERROR:    Exception in ASGI application (sglang-sim)\n{traceback.format_exc()}")
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.send_json(500, {"detail": "Internal Server Error"})

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    # ---------------------------------------------------------------- GET handlers
    def h_health(self) -> None:
        self._send(self.app.health_check(self.path.split("?", 1)[0]), b"")

    def h_models(self) -> None:
        name = self.app.args.served_model_name
        self.send_json(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(self.app.started_at),
                        "owned_by": "sglang",
                        "root": name,
                        "parent": None,
                        "max_model_len": self.app.context_len,
                    }
                ],
            },
        )

    def h_model_info(self) -> None:
        """0.5.9 ``http_server.model_info`` (http_server.py:553; ``/get_model_info`` warns first, 543)."""
        if self.path.split("?", 1)[0] == "/get_model_info":
            log(
                "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                "Please use '/model_info' instead."
            )
        a = self.app.args
        self.send_json(
            200,
            {
                "model_path": a.model_path,
                "tokenizer_path": a.tokenizer_path,
                "is_generation": not bool(a.is_embedding),
                "preferred_sampling_params": a.preferred_sampling_params,
                "weight_version": getattr(a, "weight_version", "default"),
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": self.app.model_config.model_type if self.app.model_config.path else "simulated",
                "architectures": self.app.model_config.data.get("architectures")
                if self.app.model_config.path
                else [self.app.model_type],
            },
        )

    def h_server_info(self) -> None:
        """0.5.9 ``http_server.server_info`` (http_server.py:593; ``/get_server_info`` logs a deprecation warning
        first, 583): ``dataclasses.asdict(server_args)`` + ``scheduler_info`` + ``internal_states`` + ``version``."""
        if self.path.split("?", 1)[0] == "/get_server_info":
            log(
                "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                "Please use '/server_info' instead."
            )
        self._send(200, json.dumps(self.app.server_info(), default=str).encode())

    def h_loads(self) -> None:
        """0.5.9 ``entrypoints/v1_loads.py: get_loads`` (JSON form; one DP rank), no flag needed."""
        snap = self.app.engine.snapshot()
        running, waiting = snap["num_running_reqs"], snap["num_queue_reqs"]
        load = {
            "dp_rank": 0,
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_used_tokens": snap["num_used_tokens"],
            "max_total_num_tokens": self.app.kv_tokens,
            "token_usage": round(snap["token_usage"], 4),
            "gen_throughput": round(self.app.engine.gen_throughput(), 2),
            "cache_hit_rate": 0.0,
            "utilization": round(snap["token_usage"], 4),
            "max_running_requests": self.app.args.max_running_requests or 4096,
            "num_total_reqs": running + waiting,
        }
        aggregate = {
            "total_running_reqs": running,
            "total_waiting_reqs": waiting,
            "total_reqs": running + waiting,
            "avg_token_usage": load["token_usage"],
            "avg_throughput": load["gen_throughput"],
            "avg_utilization": load["utilization"],
        }
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        body = {"timestamp": stamp, "version": SERVER_VERSION, "dp_rank_count": 1, "loads": [load]}
        self.send_json(200, {**body, "aggregate": aggregate})

    def h_metrics(self) -> None:
        """prometheus_client 0.26 ``make_asgi_app`` over the multiprocess collector (``metrics.py``); without
        ``--enable-metrics`` 0.5.9 has no such route."""
        metrics = self.app.metrics
        if metrics is None:
            self.send_json(404, {"detail": "Not Found"})
            return
        if self.command == "POST":
            self.read_body()
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        body, headers = metrics.render(self.headers.get("Accept"), self.headers.get("Accept-Encoding"), query)
        self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    # ---------------------------------------------------------------- generation helpers
    def _gate(self) -> bool:
        """Generation is refused with 503 until the server is ready (see README)."""
        if self.app.accepting_generation():
            return True
        self.send_openai_error(
            503,
            "The server is not ready yet: still loading/warming up (sglang-sim answers 503 before "
            "'The server is fired up and ready to roll!').",
            "ServiceUnavailableError",
        )
        return False

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            raise ClientGone() from e

    def _sse(self, obj: Any) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        self._chunk(f"data: {payload}\n\n".encode())

    def _end_stream(self) -> None:
        self._sse("[DONE]")
        self._chunk(b"")

    @staticmethod
    def _int_or_none(value: Any, name: str) -> int | None:
        if value is None:
            return None
        try:
            n = int(value)
        except (TypeError, ValueError) as e:
            raise BadRequest(f"{name} must be an integer, got {value!r}") from e
        if n < 0:
            raise BadRequest(f"{name} must be >= 0, got {n}")
        return n

    def _run(
        self, prompt: str, max_tokens: int | None, ignore_eos: bool, rid: str | None = None, **options: Any
    ) -> Result:
        """``engine.generate`` (``options``: its other keyword arguments) between the app's request begin and end."""
        rid = rid or self.app.engine.new_rid()
        self.app.request_begin(rid)
        try:
            return self.app.engine.generate(prompt, max_tokens, ignore_eos=ignore_eos, rid=rid, **options)
        finally:
            self.app.request_end(rid)

    @staticmethod
    def _usage(r: Result) -> dict:
        return {
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens,
            "prompt_tokens_details": None,
        }

    @staticmethod
    def _matched(r: Result) -> int | None:
        return EOS_TOKEN_ID if r.finish_reason == "stop" else None

    # ---------------------------------------------------------------- /generate (SGLang native)
    def h_generate(self) -> None:
        body = self.read_json()
        if not self._gate():
            return
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params must be an object")
        max_new = self._int_or_none(sp.get("max_new_tokens", 128), "max_new_tokens")
        ignore_eos = bool(sp.get("ignore_eos", False))
        stream = bool(body.get("stream", False))
        text = body.get("text")
        input_ids = body.get("input_ids")
        if text is None and input_ids is None:
            raise BadRequest("Either text or input_ids should be provided.")
        if isinstance(text, list) or (isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)):
            if stream:
                raise BadRequest("Streaming a batch is not supported by sglang-sim")
            prompts = text if isinstance(text, list) else [" ".join(map(str, ids)) for ids in input_ids]
            self.send_json(200, [self._generate_dict(self._run(str(p), max_new, ignore_eos)) for p in prompts])
            return
        if text is None:
            prompt, ptoks = " ".join(map(str, input_ids)), len(input_ids)
        else:
            prompt, ptoks = str(text), None
        if not stream:
            self.send_json(200, self._generate_dict(self._run(prompt, max_new, ignore_eos, prompt_tokens=ptoks)))
            return
        self._start_stream()
        acc: list[str] = []
        t0 = time.monotonic()
        rid = self.app.engine.new_rid()

        def on_piece(piece: str, i: int) -> None:
            acc.append(piece)
            self._sse(
                {
                    "text": "".join(acc),
                    "output_ids": [1000 + (hash(piece) % 50000)],
                    "meta_info": {
                        "id": rid,
                        "finish_reason": None,
                        "prompt_tokens": ptoks if ptoks is not None else 0,
                        "completion_tokens": i + 1,
                        "cached_tokens": 0,
                        "e2e_latency": time.monotonic() - t0,
                    },
                }
            )

        r = self._run(prompt, max_new, ignore_eos, on_piece=on_piece, prompt_tokens=ptoks, rid=rid)
        self._sse(self._generate_dict(r, output_ids=[]))
        self._end_stream()

    def _generate_dict(self, r: Result, output_ids: list[int] | None = None) -> dict:
        if r.finish_reason == "length":
            finish = {"type": "length", "length": r.completion_tokens}
        else:
            finish = {"type": "stop", "matched": EOS_TOKEN_ID}
        return {
            "text": r.text,
            "output_ids": _fake_ids(r) if output_ids is None else output_ids,
            "meta_info": {
                "id": r.rid,
                "finish_reason": finish,
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "cached_tokens": r.cached_tokens,
                "e2e_latency": r.e2e_latency,
            },
        }

    # ---------------------------------------------------------------- OpenAI-compatible
    @staticmethod
    def _openai(rid: str, obj: str, created: int, model: str, choices: list[dict], **usage: Any) -> dict:
        """An OpenAI response or stream chunk: id, object, created, model, choices (then ``usage=`` if given)."""
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **usage}

    def _final_choice(self, r: Result, **content: Any) -> dict:
        """The choice that ends a request: its ``content`` (text, message or delta), then how it finished."""
        return {
            "index": 0,
            **content,
            "logprobs": None,
            "finish_reason": r.finish_reason,
            "matched_stop": self._matched(r),
        }

    def _logprobs(self, body: dict, model: str, prompt: str, r: Result) -> list[dict]:
        """``choices[].logprobs.content`` of a non-streamed chat completion with ``logprobs: true`` (lab equipment:
        sglang_sim.logprobs makes the numbers up; the shape is SGLang's)."""
        from .logprobs import content

        top_n = self._int_or_none(body.get("top_logprobs"), "top_logprobs") or 0
        perturbation = self.app.fault_source.current().kernel_perturbation
        return content(str(model), prompt, r.pieces, top_n, perturbation)

    def _max_tokens(self, body: dict, default: int | None) -> int | None:
        value = body.get("max_completion_tokens")
        if value is None:
            value = body.get("max_tokens")
        if value is None:
            return default
        return self._int_or_none(value, "max_tokens")

    def _include_usage(self, body: dict) -> bool:
        so = body.get("stream_options") or {}
        return isinstance(so, dict) and bool(so.get("include_usage"))

    def h_completions(self) -> None:
        body = self.read_json()
        if not self._gate():
            return
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest("prompt is required")
        ptoks = None
        if isinstance(prompt, list):
            if prompt and all(isinstance(x, int) for x in prompt):
                ptoks = len(prompt)
                prompt = " ".join(map(str, prompt))
            elif len(prompt) == 1:
                prompt = str(prompt[0])
            else:
                prompt = "\n".join(map(str, prompt))
        prompt = str(prompt)
        max_tokens = self._max_tokens(body, 16)
        ignore_eos = bool(body.get("ignore_eos", False))
        model = body.get("model") or self.app.args.served_model_name
        created = int(time.time())
        if not body.get("stream"):
            r = self._run(prompt, max_tokens, ignore_eos, prompt_tokens=ptoks)
            choices = [self._final_choice(r, text=r.text)]
            self.send_json(200, self._openai(r.rid, "text_completion", created, model, choices, usage=self._usage(r)))
            return
        self._start_stream()
        rid = self.app.engine.new_rid()

        def on_piece(piece: str, i: int) -> None:
            choices = [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]
            self._sse(self._openai(rid, "text_completion", created, model, choices))

        r = self._run(prompt, max_tokens, ignore_eos, on_piece=on_piece, prompt_tokens=ptoks, rid=rid)
        self._sse(self._openai(rid, "text_completion", created, model, [self._final_choice(r, text="")]))
        if self._include_usage(body):
            self._sse(self._openai(rid, "text_completion", created, model, [], usage=self._usage(r)))
        self._end_stream()

    @staticmethod
    def _content_text(content: Any) -> str:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                elif isinstance(part, str):
                    parts.append(part)
            return "\n".join(parts)
        return str(content)

    def h_chat(self) -> None:
        body = self.read_json()
        if not self._gate():
            return
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        templated = []
        last_user = ""
        for m in messages:
            if not isinstance(m, dict):
                raise BadRequest("each message must be an object")
            role = str(m.get("role", "user"))
            text = self._content_text(m.get("content"))
            templated.append(f"<|{role}|>\n{text}")
            if role == "user":
                last_user = text
        templated.append("<|assistant|>")
        from .textgen import tokenize

        prompt_token_list = tokenize("\n".join(templated))
        prompt_tokens = len(prompt_token_list)
        answer_prompt = last_user or "\n".join(templated)
        max_tokens = self._max_tokens(body, None)
        ignore_eos = bool(body.get("ignore_eos", False))
        model = body.get("model") or self.app.args.served_model_name
        created = int(time.time())
        think = model_thinks(body)
        parser = self.app.args.reasoning_parser
        separate = parser is not None and body.get("separate_reasoning", True) is not False
        force_reasoning = separate and reasoning_from_request(parser, body)
        if not body.get("stream"):
            r = self._run(
                answer_prompt,
                max_tokens,
                ignore_eos,
                prompt_tokens=prompt_tokens,
                think=think,
                cache_tokens=prompt_token_list,
            )
            reasoning, text = parse_reasoning(r.text, force_reasoning) if separate else ("", r.text)
            message = {
                "role": "assistant",
                "content": text if text else None,
                "reasoning_content": reasoning if reasoning else None,
                "tool_calls": None,
            }
            choices = [self._final_choice(r, message=message)]
            if body.get("logprobs"):
                choices[0]["logprobs"] = {"content": self._logprobs(body, model, answer_prompt, r)}
            self.send_json(200, self._openai(r.rid, "chat.completion", created, model, choices, usage=self._usage(r)))
            return
        self._start_stream()
        rid = self.app.engine.new_rid()

        def chunk(delta: dict) -> dict:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            return self._openai(rid, "chat.completion.chunk", created, model, [choice])

        self._sse(chunk({"role": "assistant", "content": ""}))
        stream_parser = StreamingReasoningParser(force_reasoning) if separate else None

        def on_piece(piece: str, i: int) -> None:
            if stream_parser is None:
                self._sse(chunk({"content": piece}))
                return
            reasoning, text = stream_parser.feed(piece)
            if reasoning:
                self._sse(chunk({"reasoning_content": reasoning}))
            if text:
                self._sse(chunk({"content": text}))

        r = self._run(
            answer_prompt,
            max_tokens,
            ignore_eos,
            on_piece=on_piece,
            prompt_tokens=prompt_tokens,
            rid=rid,
            think=think,
            cache_tokens=prompt_token_list,
        )
        self._sse(self._openai(rid, "chat.completion.chunk", created, model, [self._final_choice(r, delta={})]))
        if self._include_usage(body):
            self._sse(self._openai(rid, "chat.completion.chunk", created, model, [], usage=self._usage(r)))
        self._end_stream()


def bind_error_message(host: str, port: int, errno_: int = 98, text: str = "address already in use") -> str:
    return f"ERROR:    [Errno {errno_}] error while attempting to bind on address ('{host}', {port}): {text}"


def access_log_default() -> bool:
    return os.environ.get("SGLANG_SIM_ACCESS_LOG", "1").strip().lower() not in ("0", "false", "no", "off")

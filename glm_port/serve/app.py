"""The HTTP side of ``glm-serve``: OpenAI's API on FastAPI over one ``Engine``.

``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed as Server-Sent
Events with ``"stream": true``), ``GET /health``, and the chat page at ``/``. Every error is OpenAI's
``{"error": {"message", "type", "param", "code"}}`` with its status: 400 for a body that is not valid JSON
or not a valid request, a prompt over the limits or a model that cannot do what was asked; 401 for a
missing or wrong API key; 404 for an unknown model or path; 413 for a body over the size cap; 429 when
the queue is full.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from glm_port.serve.engine import Engine, Event, QueueFull, Sampling, Sequence


@dataclass
class Limits:
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None  # None: the model's seq_length - 1
    max_tokens: int = 2048  # the largest max_tokens a request may ask
    max_n: int = 8
    temperature: float = 0.8  # defaults where a request gives none (THUDM's chat defaults)
    top_p: float = 0.8


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def error_body(message: str, type_: str, param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None):
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


# ---------------------------------------------------------------- request bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Body):
    type: str
    text: str | None = None


class ToolCallFunction(_Body):
    name: str
    arguments: str = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content if part.type == "text")
        return self.content or ""


class _Sampled(_Body):
    model: str
    stream: bool = False
    stream_options: dict | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)
    # OpenAI fields this server does not do: refused by name (400) rather than ignored
    logprobs: Any = None
    top_logprobs: Any = None
    echo: Any = None
    best_of: Any = None
    suffix: Any = None
    response_format: Any = None


UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "best_of", "suffix", "response_format")


class ChatRequest(_Sampled):
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Sampled):
    prompt: str | list[str]


# ---------------------------------------------------------------- the app
def create_app(engine: Engine, *, api_key: str | None = None, limits: Limits | None = None) -> FastAPI:
    limits = limits or Limits()
    served = engine.served
    prompt_cap = min(limits.max_prompt_tokens or served.seq_length - 1, served.seq_length - 1)
    app = FastAPI(title="glm-serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.limits = engine, limits

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:])
        if first.get("type") == "json_invalid":
            message, where = "the request body is not valid JSON", ""
        else:
            message = f"{where or 'body'}: {first.get('msg', 'invalid')}"
        return error_response(400, message, param=where or None, code="invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(exc.status_code, str(exc.detail), code=code)

    @app.exception_handler(Exception)
    async def _crash(request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}", "server_error")

    app.add_middleware(Guard, max_bytes=limits.max_body_bytes, api_key=api_key)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": served.name, "queued": engine.queued(), "running": len(engine.running)}

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return resources.files("glm_port.serve").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(served)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        _check_model(served, name)
        return _model_card(served)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        _check_model(served, body.model)
        if served.chat is None:
            raise APIError(400, f"{served.name} ({served.family.name}) has no chat format; use /v1/completions",
                           param="messages", code="unsupported")
        messages = [_message_dict(m) for m in body.messages]
        if body.tool_choice not in (None, "auto", "none"):
            raise APIError(400, "tool_choice: only \"auto\" and \"none\" (the model decides whether to call a tool)",
                           param="tool_choice", code="unsupported")
        tools = body.tools if body.tools and body.tool_choice != "none" else None
        try:
            ids = served.encode_chat(messages, tools)
        except ValueError as error:
            raise APIError(400, str(error), param="messages") from None
        max_tokens = body.max_completion_tokens or body.max_tokens
        sampling = _sampling(body, max_tokens, len(ids), served, limits, prompt_cap)
        sequences, queue = _sequences(request, body.n, lambda i, notify: Sequence(
            ids, sampling, notify, index=i, chat=True, tools=tools, stream=body.stream))
        return await _respond(engine, request, body, sequences, queue, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(served, body.model)
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise APIError(400, "prompt: one prompt per request (send a list of one, or a string)", param="prompt")
        prompt = prompts[0]
        ids = served.encode_prompt(prompt)
        sampling = _sampling(body, body.max_tokens or 16, len(ids), served, limits, prompt_cap)
        sequences, queue = _sequences(request, body.n, lambda i, notify: Sequence(
            ids, sampling, notify, index=i, chat=False, text=prompt, stream=body.stream))
        return await _respond(engine, request, body, sequences, queue, chat=False)

    return app


class Guard:
    """A pure ASGI middleware (no per-chunk cost on streams): ``/v1/`` without ``Authorization: Bearer KEY``
    matching ``api_key`` is answered 401 (compared in constant time, ``hmac.compare_digest``); a request body
    over ``max_bytes`` (by its Content-Length, or as it arrives when chunked) 413, before the app reads it."""

    def __init__(self, app, max_bytes: int, api_key: str | None = None):
        self.app, self.max_bytes = app, max_bytes
        self.api_key = api_key.encode() if api_key is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and scope.get("path", "").startswith("/v1/"):
            header = headers.get(b"authorization", b"")
            given = header[7:] if header[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(given, self.api_key):
                return await error_response(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                            code="invalid_api_key")(scope, receive, send)
        length = headers.get(b"content-length")
        too_big = error_response(413, f"request body over the server's limit of {self.max_bytes} bytes",
                                 code="body_too_large")
        if length is not None:
            try:
                if int(length) > self.max_bytes:
                    return await too_big(scope, receive, send)
            except ValueError:
                return await error_response(400, "bad Content-Length")(scope, receive, send)
            return await self.app(scope, receive, send)
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:  # chunked: read it all here, up to the cap, then hand it on
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await too_big(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _model_card(served) -> dict:
    return {"id": served.name, "object": "model", "created": 0, "owned_by": "glm-migrate",
            "family": served.family.name, "chat_format": served.chat_format, "max_model_len": served.seq_length}


def _check_model(served, name: str):
    if name != served.name:
        raise APIError(404, f"model {name!r} is not served here (this server serves {served.name!r})",
                       param="model", code="model_not_found")


def _message_dict(message: Message) -> dict:
    out = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
    if message.tool_calls:
        out["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return out


def _sampling(body: _Sampled, max_tokens, prompt_tokens: int, served, limits: Limits, prompt_cap: int) -> Sampling:
    for name in UNSUPPORTED:
        value = getattr(body, name)
        if name == "response_format":
            bad = value is not None and not (isinstance(value, dict) and value.get("type") == "text")
        else:
            bad = value not in (None, False) and not (name == "best_of" and value == 1)
        if bad:
            raise APIError(400, f"{name}: not supported by this server", param=name, code="unsupported")
    if body.n > limits.max_n:
        raise APIError(400, f"n: at most {limits.max_n} choices per request", param="n")
    if prompt_tokens > prompt_cap:
        raise APIError(400, f"the prompt has {prompt_tokens} tokens, over this server's limit of {prompt_cap}",
                       param="messages" if isinstance(body, ChatRequest) else "prompt",
                       code="context_length_exceeded")
    room = served.seq_length - prompt_tokens
    if max_tokens is None:
        max_tokens = min(limits.max_tokens, room)
    elif max_tokens > limits.max_tokens:
        raise APIError(400, f"max_tokens: {max_tokens} is over this server's limit of {limits.max_tokens}",
                       param="max_tokens", code="max_tokens_exceeded")
    elif max_tokens > room:
        raise APIError(400, f"max_tokens: the prompt's {prompt_tokens} tokens + {max_tokens} exceed the model's "
                            f"{served.seq_length}", param="max_tokens", code="context_length_exceeded")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop: at most 4 non-empty strings", param="stop")
    return Sampling(
        max_tokens=max_tokens,
        temperature=limits.temperature if body.temperature is None else body.temperature,
        top_p=limits.top_p if body.top_p is None else body.top_p, top_k=body.top_k or 0, seed=body.seed,
        frequency_penalty=body.frequency_penalty, presence_penalty=body.presence_penalty,
        repetition_penalty=body.repetition_penalty or 1.0, stop=tuple(stop))


def _sequences(request, n, make):
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def notify(event: Event):
        loop.call_soon_threadsafe(queue.put_nowait, event)

    return [make(i, notify) for i in range(n)], queue


async def _respond(engine: Engine, request: Request, body: _Sampled, sequences, queue, chat: bool):
    try:
        engine.submit(sequences)
    except QueueFull as error:
        raise APIError(429, str(error), "rate_limit_error", code="queue_full") from None
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_stream(engine, sequences, queue, ident, created, body.model, chat, usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    finals: dict[int, Event] = {}

    async def disconnected():  # the body has been read: the next message is the client leaving
        while (await request.receive())["type"] != "http.disconnect":
            pass

    gone = asyncio.ensure_future(disconnected())
    try:
        while len(finals) < len(sequences):
            waiting = asyncio.ensure_future(queue.get())
            await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                engine.cancel(sequences)  # their rows leave the batch at the next step
                return error_response(499, "client closed the request")
            event = waiting.result()
            if event.finish_reason is not None:
                finals[event.index] = event
    finally:
        gone.cancel()
        if len(finals) < len(sequences):
            engine.cancel(sequences)
    errors = [e.error for e in finals.values() if e.error]
    if errors:
        return error_response(500, f"generation failed: {errors[0]}", "server_error")
    events = [finals[i] for i in range(len(sequences))]
    usage = {"prompt_tokens": events[0].prompt_tokens,
             "completion_tokens": sum(e.completion_tokens for e in events)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    if chat:
        choices = [{"index": e.index, "message": _message(e), "logprobs": None, "finish_reason": e.finish_reason}
                   for e in events]
        return {"id": ident, "object": "chat.completion", "created": created, "model": body.model,
                "choices": choices, "usage": usage}
    choices = [{"index": e.index, "text": e.content, "logprobs": None, "finish_reason": e.finish_reason}
               for e in events]
    return {"id": ident, "object": "text_completion", "created": created, "model": body.model, "choices": choices,
            "usage": usage}


def _tool_calls(event: Event) -> list[dict]:
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call["name"], "arguments": call["arguments"]}} for call in event.tool_calls]


def _message(event: Event) -> dict:
    message = {"role": "assistant", "content": event.content or (None if event.tool_calls else "")}
    if event.tool_calls:
        message["tool_calls"] = _tool_calls(event)
    return message


def _sse(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _stream(engine, sequences, queue, ident, created, model, chat, include_usage):
    """The SSE body: the deltas of each choice's text as it grows, its finish reason, usage if asked, [DONE].
    Closing it (the client went away) cancels the sequences: their rows leave the batch at the next step."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    shown = {s.index: "" for s in sequences}
    done: dict[int, Event] = {}

    def chunk(index, delta=None, text=None, finish=None):
        if chat:
            choice = {"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        return _sse({"id": ident, "object": kind, "created": created, "model": model, "choices": [choice]})

    try:
        if chat:
            for s in sequences:
                yield chunk(s.index, {"role": "assistant", "content": ""})
        while len(done) < len(sequences):
            events = [await queue.get()]
            while not queue.empty():  # behind: only each choice's newest text matters (it holds all before it)
                events.append(queue.get_nowait())
            latest = {}
            for event in events:
                if latest.get(event.index) is None or latest[event.index].finish_reason is None:
                    latest[event.index] = event
            for event in latest.values():
                if event.error:
                    yield _sse(error_body(f"generation failed: {event.error}", "server_error"))
                    return
                before = shown[event.index]
                text = event.content[len(before):] if event.content.startswith(before) else ""
                if text:
                    shown[event.index] = before + text
                    yield chunk(event.index, {"content": text}, text)
                if event.finish_reason is not None:
                    done[event.index] = event
                    delta = {"tool_calls": [{"index": k, **call} for k, call in enumerate(_tool_calls(event))]} \
                        if event.tool_calls else {}
                    yield chunk(event.index, delta, "", event.finish_reason)
        if include_usage:
            events = list(done.values())
            prompt = events[0].prompt_tokens
            completion = sum(e.completion_tokens for e in events)
            yield _sse({"id": ident, "object": kind, "created": created, "model": model, "choices": [],
                        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                  "total_tokens": prompt + completion}})
        yield "data: [DONE]\n\n"
    finally:
        if len(done) < len(sequences):
            engine.cancel(sequences)

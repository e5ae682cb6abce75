"""The FastAPI application: the server's state, the checks every request passes (API key, body size, JSON), the
error objects, and the small endpoints (``/health``, ``/metrics``, ``/v1/models``). The generation endpoints are
in :mod:`.openai_routes` and :mod:`.anthropic_routes`.

Every error is an API error object with a 4xx status (OpenAI's form, Anthropic's on ``/v1/messages``): a body that
is not JSON or does not match the request model is a 400 naming the field, an unknown model a 404, a body over
``max_body_bytes`` a 413, a missing or wrong API key a 401, a full queue a 429. A failure inside the engine ends
that request with an error and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import LucegenError
from .metrics import Metrics
from .protocol import ANTHROPIC_ERROR_TYPES, OPENAI_ERROR_TYPES, ModelCard, ModelList
from .scheduler import Scheduler

@dataclass
class ServeOptions:
    model_name: str
    slots: int = 1
    queue_size: int = 64
    api_key: str | None = None
    max_body_bytes: int = 8 << 20
    think_max_tokens: int | None = None
    shutdown_timeout: float = 5.0  # seconds the requests in flight get to finish when the server stops


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class Server:
    """What the routes share: the LLM, its scheduler and metrics, and the options."""

    def __init__(self, llm, options: ServeOptions):
        self.llm, self.options = llm, options
        self.metrics = Metrics()
        self.created = int(time.time())
        self.closed = False
        self.scheduler = Scheduler(llm.engine, llm.tokenizer, options.slots, options.queue_size, self.metrics)

    def check_model(self, name: str) -> None:
        if name != self.options.model_name:
            raise ApiError(404, f"The model '{name}' does not exist; this server serves "
                                f"'{self.options.model_name}'", "model", "model_not_found")

    def close(self, timeout: float = 30.0) -> None:
        """Finish (up to ``timeout`` seconds) or cancel the requests in flight, then free the engine. Once."""
        if self.closed:
            return
        self.closed = True
        self.scheduler.shutdown(timeout)
        self.llm.close()


def error_body(path: str, status: int, message: str, param: str | None = None, code=None) -> dict:
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"),
                                           "message": message}}
    return {"error": {"message": message, "type": OPENAI_ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code if code is not None else status}}


def error_response(request: Request, status: int, message: str, param=None, code=None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message, param, code), status_code=status)


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """The first problem of a pydantic ValidationError as one line, and the field it names."""
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    value = repr(first.get("input"))
    value = value if len(value) <= 80 else value[:77] + "..."
    return f"{where or 'body'}: {first.get('msg')} (got {value})", where or None


async def read_json(request: Request, model, limit: int):
    """The body as ``model``: 413 over ``limit`` bytes, 400 when it is not UTF-8 JSON or does not validate."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body has {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ApiError(400, "the request body nests too deeply") from None
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise ApiError(400, message, param) from None
    except RecursionError:
        raise ApiError(400, "the request body nests too deeply") from None


def check_api_key(request: Request, key: str | None) -> None:
    """``Authorization: Bearer KEY`` (OpenAI clients) or ``x-api-key: KEY`` (Anthropic clients)."""
    if key is None:
        return
    given = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    if given is None:
        raise ApiError(401, "no API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
    if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode()):
        raise ApiError(401, "the API key is wrong")


def create_app(server: Server) -> FastAPI:
    from . import anthropic_routes, openai_routes

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(server.close, server.options.shutdown_timeout)

    app = FastAPI(title="lucegen", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        server.metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return error_response(request, exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(LucegenError)
    async def lucegen_error(request: Request, exc: LucegenError):
        return error_response(request, 400, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error_response(request, exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, exc: RequestValidationError):
        return error_response(request, 400, str(exc.errors()[0].get("msg")) if exc.errors() else "invalid request")

    @app.get("/health")
    async def health():
        return {"status": "ok", "active_slots": server.scheduler.active(), "slots": server.options.slots,
                "queued": server.scheduler.waiting()}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request):
        check_api_key(request, server.options.api_key)
        card = ModelCard(id=server.options.model_name, created=server.created, max_model_len=server.llm.max_context)
        return ModelList(data=[card]).model_dump()

    app.include_router(openai_routes.router)
    app.include_router(anthropic_routes.router)
    return app

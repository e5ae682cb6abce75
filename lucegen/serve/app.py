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
import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import LucegenError
from . import anthropic_routes, openai_routes
from .generation import ClientGone
from .http import ApiError, check_api_key, error_response
from .metrics import Metrics
from .protocol import ModelCard, ModelList
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


class DrainingUvicorn(uvicorn.Server):
    """uvicorn's server for a :class:`Server`. On SIGINT/SIGTERM (``handle_exit``) it also starts the scheduler's
    shutdown, so that the open streams finish or end with an error event within ``shutdown_timeout`` seconds,
    before uvicorn's own graceful-shutdown timeout (5 s later) would cut them mid-response; then the lifespan's
    end closes the engine."""

    def __init__(self, server: Server, host: str, port: int, log_level: str = "warning"):
        self.lucegen = server
        super().__init__(uvicorn.Config(create_app(server), host=host, port=port, log_level=log_level,
                                        timeout_graceful_shutdown=int(server.options.shutdown_timeout) + 5))

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            threading.Thread(target=self.lucegen.scheduler.shutdown, args=(self.lucegen.options.shutdown_timeout,),
                             daemon=True).start()
        super().handle_exit(sig, frame)


def create_app(server: Server) -> FastAPI:
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

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

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

    @app.get("/v1/models/{name:path}")
    async def model(request: Request, name: str):
        check_api_key(request, server.options.api_key)
        server.check_model(name)
        return ModelCard(id=name, created=server.created, max_model_len=server.llm.max_context).model_dump()

    app.include_router(openai_routes.router)
    app.include_router(anthropic_routes.router)
    return app

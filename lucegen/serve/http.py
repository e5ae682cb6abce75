"""What every request passes and every error looks like: the API key, the body read within its size limit and
validated against its pydantic model, the model name, and the error objects (OpenAI's form, Anthropic's on
``/v1/messages``)."""

from __future__ import annotations

import hmac
import json

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from .protocol import ANTHROPIC_ERROR_TYPES, OPENAI_ERROR_TYPES, ErrorDetail, ErrorResponse


class ApiError(Exception):
    """An HTTP error answered with an error object: status, message, the field it is about, a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(path: str, status: int, message: str, param: str | None = None, code=None) -> dict:
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"),
                                           "message": message}}
    detail = ErrorDetail(message=message, type=OPENAI_ERROR_TYPES.get(status, "server_error"), param=param,
                         code=code if code is not None else status)
    return ErrorResponse(error=detail).model_dump()


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


async def read_request(request: Request, model):
    """The server and the body of a request to a generation endpoint as ``model``: the API key checked (401), the
    body read (413, 400), then its ``model`` field checked against the served model (404)."""
    server = request.app.state.server
    check_api_key(request, server.options.api_key)
    body = await read_json(request, model, server.options.max_body_bytes)
    server.check_model(body.model)
    return server, body


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

"""API errors as `{"error": {"code", "message"}}`, strict JSON body reading and query parameters.

Bodies over the size limit are refused (413) from Content-Length, or while streaming in,
before anything is parsed; malformed JSON is a 422 that says where it broke.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
N = TypeVar("N", int, float)


class APIError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Serialise with the stdlib directly: cheaper than FastAPI's encoder for plain dicts."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": {"code": code, "message": message}}, status, headers)


def describe_validation_error(exc: ValidationError, where: str = "body") -> str:
    parts = []
    for err in exc.errors(include_url=False)[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(root)"
        parts.append(f"{where}.{loc}: {err.get('msg', 'invalid')}")
    more = len(exc.errors()) - 10
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


class _NonFiniteNumber(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NonFiniteNumber(name)


async def read_json(request: Request, limit: int, *, allow_empty: bool = False) -> Any:
    """The parsed JSON body, or APIError 413/422 that says what is wrong."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise APIError(400, "bad_request", f"Content-Length {declared!r} is not a number") from None
        if size > limit:
            raise APIError(
                413,
                "body_too_large",
                f"request body is {size} bytes; this server accepts at most {limit} bytes (--max-body-bytes)",
            )
        body = await request.body()
    else:
        chunks = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise APIError(
                    413,
                    "body_too_large",
                    f"request body exceeds {limit} bytes; this server accepts at most {limit} bytes "
                    "(--max-body-bytes)",
                )
            chunks.append(chunk)
        body = b"".join(chunks)
    if not body.strip():
        if allow_empty:
            return None
        raise APIError(422, "invalid_json", "request body is empty; send a JSON object")
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except _NonFiniteNumber as exc:
        raise APIError(
            422, "invalid_json", f"request body contains {exc}, which is not JSON; send finite numbers"
        ) from None
    except UnicodeDecodeError as exc:
        raise APIError(422, "invalid_json", f"request body is not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise APIError(
            422,
            "invalid_json",
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})",
        ) from None


async def read_model(request: Request, model: type[M], limit: int, *, allow_empty: bool = False) -> M:
    """Read and validate a body; an empty body gives the model's defaults when allowed."""
    payload = await read_json(request, limit, allow_empty=allow_empty)
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise APIError(422, "invalid_body", f"request body must be a JSON object, got {type(payload).__name__}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise APIError(422, "invalid_body", describe_validation_error(exc)) from None


def query_int(name: str, raw: str | None, default: int, lo: int, hi: int) -> int:
    """An integer query parameter in [lo, hi]; absent or empty gives `default`."""
    if raw is None or raw == "":
        return default
    value = _parse_query(name, raw, int, "an integer")
    if not lo <= value <= hi:
        raise APIError(422, "invalid_query", f"query parameter {name}={value} must be between {lo} and {hi}")
    return value


def query_float(name: str, raw: str | None, default: float) -> float:
    """A finite number >= 0 from the query; absent or empty gives `default`."""
    if raw is None or raw == "":
        return default
    value = _parse_query(name, raw, float, "a number")
    if not value >= 0 or value == float("inf"):
        raise APIError(422, "invalid_query", f"query parameter {name}={raw!r} must be a finite number >= 0")
    return value


def _parse_query(name: str, raw: str, parse: Callable[[str], N], what: str) -> N:
    try:
        return parse(raw)
    except ValueError:
        raise APIError(422, "invalid_query", f"query parameter {name}={raw!r} must be {what}") from None

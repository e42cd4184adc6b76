"""API errors as `{"error": {"code", "message"}}`, strict JSON body reading and query parameters.

Bodies over their route's size limit are refused (413) from Content-Length before any of the
body is read, or while streaming in; malformed JSON is a 422 that says where it broke, and JSON
nested past the depth limit a 422 that says so (never the parser's RecursionError).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BodyLimit:
    """What one route reads of a request body: at most `max_bytes` (set by the flag `setting`, named
    in the refusal), JSON nested at most `max_depth` deep."""

    max_bytes: int
    setting: str
    max_depth: int


def too_deep(value: Any, max_depth: int) -> bool:
    """Whether JSON `value` nests objects and arrays deeper than `max_depth` (`{}` is 1 deep).
    Iterative: a deep value cannot exhaust the interpreter's stack here."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > max_depth:
                    return True
                stack.append((child, depth + 1))
    return False


def _too_large(declared: str, limit: BodyLimit) -> APIError:
    return APIError(
        413,
        "body_too_large",
        f"request body is {declared} bytes; this endpoint accepts at most {limit.max_bytes} bytes ({limit.setting})",
    )


def _too_deep(limit: BodyLimit) -> APIError:
    return APIError(
        422,
        "invalid_json",
        f"request body nests objects and arrays more than {limit.max_depth} deep; this server reads at most that depth",
    )


def declared_length(request: Request) -> int | None:
    """The request's Content-Length, or None without one; 400 when it is not a number."""
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    try:
        size = int(declared)
    except ValueError:
        raise APIError(400, "bad_request", f"Content-Length {declared!r} is not a number") from None
    if size < 0:
        raise APIError(400, "bad_request", f"Content-Length {declared!r} is negative")
    return size


async def read_json(request: Request, limit: BodyLimit, *, allow_empty: bool = False) -> Any:
    """The parsed JSON body, or APIError 413/422 that says what is wrong. A body declared larger
    than the limit is refused before any of it is read; one without a Content-Length is read
    until it passes the limit, and refused there."""
    size = declared_length(request)
    if size is not None:
        if size > limit.max_bytes:
            raise _too_large(str(size), limit)
        body = await request.body()
    else:
        chunks = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit.max_bytes:
                raise _too_large(f"more than {limit.max_bytes}", limit)
            chunks.append(chunk)
        body = b"".join(chunks)
    if not body.strip():
        if allow_empty:
            return None
        raise APIError(422, "invalid_json", "request body is empty; send a JSON object")
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:  # deeper than the parser's own stack allows
        raise _too_deep(limit) from None
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
    # Fewer opening brackets than the depth limit cannot nest past it: no walk then.
    if body.count(b"[") + body.count(b"{") > limit.max_depth and too_deep(value, limit.max_depth):
        raise _too_deep(limit)
    return value


async def read_model(request: Request, model: type[M], limit: BodyLimit, *, allow_empty: bool = False) -> M:
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

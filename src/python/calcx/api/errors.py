"""The one error a call to the calcx server raises, from the server's error shape.

The server answers errors as `{"error": {"code": "...", "message": "..."}}`; `CalcxAPIError`
carries the HTTP status, that code and message, and the request that failed. A server that
cannot be reached is status 0, code `unreachable`.
"""

from __future__ import annotations

import httpx

UNREACHABLE = "unreachable"
#: a 2xx answer that is not the endpoint's model
BAD_RESPONSE = "bad_response"
#: run leases (409): another trainer holds the run; the writer does not hold it; the table is full
RUN_LEASED = "run_leased"
LEASE_LOST = "lease_lost"
LEASE_LIMIT = "lease_limit"


class CalcxAPIError(Exception):
    """`status` (0: unreachable), `code` and `message` from the server, `request` ("PUT http://.../v1/models")."""

    def __init__(self, status: int, code: str, message: str, request: str = "") -> None:
        self.status = status
        self.code = code
        self.message = message
        self.request = request
        text = f"calcx server: {status} {code}: {message}"
        super().__init__(f"{text} ({request})" if request else text)

    @property
    def unreachable(self) -> bool:
        """No answer came back (connection refused or dropped, timeout)."""
        return self.status == 0

    @classmethod
    def from_response(cls, response: httpx.Response, request: str) -> CalcxAPIError:
        code, message = "http_error", response.text[:500] or response.reason_phrase
        try:
            body = response.json()
            err = body.get("error") if isinstance(body, dict) else None
            if isinstance(err, dict):
                code = str(err.get("code", code))
                message = str(err.get("message", message))
        except ValueError:
            pass
        return cls(response.status_code, code, message, request)

    @classmethod
    def from_transport(cls, exc: Exception, request: str) -> CalcxAPIError:
        return cls(0, UNREACHABLE, f"{type(exc).__name__}: {exc}", request)

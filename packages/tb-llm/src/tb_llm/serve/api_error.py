"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` + a status."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(404, message, "invalid_request_error", param, code)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, "invalid_request_error", None, "invalid_api_key")


def too_large(message: str) -> APIError:
    return APIError(413, message, "invalid_request_error", None, "request_too_large")


def too_many(message: str) -> APIError:
    return APIError(429, message, "rate_limit_error", None, "rate_limit_exceeded")


def server_error(message: str, status: int = 500) -> APIError:
    return APIError(status, message, "server_error", None, None)

"""OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

Every refusal of the API is one of these, naming the request parameter that fixes it (``param``), so the
``openai`` client raises its own typed exception (BadRequestError, PermissionDeniedError, NotFoundError...)."""
from __future__ import annotations

from dataclasses import dataclass

INVALID = "invalid_request_error"
AUTH = "authentication_error"
PERMISSION = "permission_error"
NOT_FOUND = "not_found_error"
SERVER = "server_error"
UNSUPPORTED = "unsupported"  # the code of a request for an OpenAI feature the studio does not have


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str = INVALID
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, INVALID, param, code)


def unsupported(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, INVALID, param, UNSUPPORTED)


def not_found(what: str, ident: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"No {what} found with id '{ident}'.", INVALID, param, "not_found")


def forbidden(message: str) -> ApiError:
    return ApiError(403, message, PERMISSION, None, "permission_denied")

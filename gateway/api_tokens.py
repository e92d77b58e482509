"""API tokens as the fine-tuning API checks them (gateway/api.py): verified with argon2 once per process, then known by
their hash."""
from __future__ import annotations

import hashlib
import threading

from db import users
from db.store import Store
from trainer_core.api.errors import AUTH, ApiError
from trainer_core.auth import access


class VerifiedTokens:
    """Tokens this process verified, by their sha256 (memory only): argon2 costs 0.1 to 0.8 s a check on a busy host,
    which a script polling a job would pay on every call. Each request still reads the token's row and its user:
    a revoked or replaced token, a removed user and a changed role count at once."""

    MAX = 10_000

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, str]] = {}  # sha256 of the token -> (token id, its stored hash)
        self._lock = threading.Lock()

    def actor(self, store: Store, token: str) -> access.Actor:
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            known = self._known.get(digest)
        if known is not None:
            actor = users.verified_actor(store, *known)
            if actor is not None:
                return actor
        try:
            actor = users.user_for_token(store, token)
        except users.UnknownToken as exc:
            raise ApiError(401, f"Incorrect API key provided: {exc}", AUTH, None, "invalid_api_key") from None
        token_id = users.token_id_of(token)
        with self._lock:
            if len(self._known) >= self.MAX:
                self._known.clear()
            self._known[digest] = (token_id, users.stored_hash(store, token_id))
        return actor

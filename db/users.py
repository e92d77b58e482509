"""Users and API tokens, on the store's database.

A token is ``fts_<id>_<secret>``: the id finds the row, and only an argon2 hash of the whole token is
stored (argon2-cffi, with its default parameters), so a copy of the database gives no usable token.
A session cookie carries its user's ``session_generation``; it works only while the user exists with that
generation (the sign-in service and the dashboard check it on every request): sign-out, a lower role and
removal end every session at once, and a lower role or removal deletes the user's tokens too.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, delete, select

from db.models import ApiToken, User
from db.store import Store
from trainer_core.auth.access import Actor, Role

TOKEN_PREFIX = "fts_"
_hasher = PasswordHasher()


class UnknownToken(PermissionError):
    """The token is malformed, revoked or wrong."""


def get_user(store: Store, name: str) -> User | None:
    with Session(store.engine) as session:
        return session.get(User, name)


def list_users(store: Store) -> list[User]:
    with Session(store.engine) as session:
        return list(session.exec(select(User).order_by(User.name)))


def ensure_user(store: Store, name: str, role: Role) -> User:
    """The user ``name``, created with ``role`` if new (an existing user keeps the role an admin gave it)."""
    now = time.time()
    with store._write_lock, Session(store.engine) as session:
        user = session.get(User, name)
        if user is None:
            # A random first generation: cookies of a removed user never come back to life when someone
            # adds the same name again (31 bits: an INTEGER column on PostgreSQL too, with room to count up).
            user = User(name=name, role=Role(role).value, created_at=now, session_generation=secrets.randbelow(1 << 30))
        user.last_seen_at = now
        session.add(user)
        session.commit()
        session.refresh(user)
        return user


class RoleChanged(ValueError):
    """The stored role is not the one the change was asked against (another admin changed it meanwhile)."""


_RANK = {role: rank for rank, role in enumerate(Role)}  # viewer < operator < admin


def set_role(store: Store, name: str, role: Role, expected: Role | None = None) -> None:
    """Give ``name`` the role ``role``. With ``expected``, only if that is still the stored role (else
    RoleChanged, nothing written): a page acts on the value it showed, never on an older one.

    A lower role ends the user's sessions and deletes their API tokens at once: what they could do with
    the higher role must not outlive the decision."""
    with store._write_lock, Session(store.engine) as session:
        user = session.get(User, name)
        if user is None:
            raise KeyError(f"there is no user {name!r}")
        if expected is not None and user.role != Role(expected).value:
            raise RoleChanged(f"{name}'s role was changed to {user.role} meanwhile (not {Role(expected).value}); "
                              "nothing was changed: look again and choose")
        if _RANK[Role(role)] < _RANK[Role(user.role)]:
            user.session_generation += 1
            session.exec(delete(ApiToken).where(ApiToken.user == name))
        user.role = Role(role).value
        session.add(user)
        session.commit()


def delete_user(store: Store, name: str) -> bool:
    """Remove ``name`` and their API tokens; their sessions end with the row. False if there was none."""
    with store._write_lock, Session(store.engine) as session:
        session.exec(delete(ApiToken).where(ApiToken.user == name))
        result = session.exec(delete(User).where(User.name == name))
        session.commit()
        return bool(result.rowcount)


def end_sessions(store: Store, name: str) -> None:
    """Sign ``name`` out everywhere: every session cookie issued so far stops working (tokens stay)."""
    with store._write_lock, Session(store.engine) as session:
        user = session.get(User, name)
        if user is not None:
            user.session_generation += 1
            session.add(user)
            session.commit()


def session_user(store: Store, name: str, generation: int) -> User | None:
    """The user a session cookie (or the proxy's headers) stands for, or None when that session has
    ended: the user was removed, signed out everywhere, or was given a lower role since."""
    user = get_user(store, name)
    return user if user is not None and user.session_generation == generation else None


def actor_for(store: Store, name: str) -> Actor:
    """The acting user as the database knows it; someone not (yet) in the table is a viewer."""
    user = get_user(store, name)
    return Actor(name, Role(user.role) if user else Role.VIEWER)


def create_token(store: Store, user: str, label: str = "") -> str:
    """A new token for ``user``; the return value is the only time the token exists in clear."""
    token_id = secrets.token_hex(6)
    token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    with store._write_lock, Session(store.engine) as session:
        session.add(ApiToken(id=token_id, user=user, label=label[:100], token_hash=_hasher.hash(token),
                             created_at=time.time()))
        session.commit()
    return token


def tokens_of(store: Store, user: str) -> list[ApiToken]:
    with Session(store.engine) as session:
        return list(session.exec(select(ApiToken).where(ApiToken.user == user).order_by(ApiToken.created_at)))


def revoke_token(store: Store, user: str, token_id: str) -> bool:
    with store._write_lock, Session(store.engine) as session:
        result = session.exec(delete(ApiToken).where(ApiToken.id == token_id, ApiToken.user == user))
        session.commit()
        return bool(result.rowcount)


def user_for_token(store: Store, token: str) -> Actor:
    """The actor a token stands for. Raises UnknownToken without saying which part was wrong."""
    parts = token.strip().removeprefix(TOKEN_PREFIX).split("_", 1)
    if not token.startswith(TOKEN_PREFIX) or len(parts) != 2:
        raise UnknownToken("this is not a Finetune Studio API token (they start with fts_)")
    with Session(store.engine) as session:
        row = session.get(ApiToken, parts[0])
    try:
        if row is None:
            raise VerificationError
        _hasher.verify(row.token_hash, token.strip())
    except (VerificationError, InvalidHashError):
        raise UnknownToken("the API token is unknown or was revoked; create a new one on the Account page") from None
    with store._write_lock, Session(store.engine) as session:
        stored, user = session.get(ApiToken, row.id), session.get(User, row.user)
        if stored is None or user is None:  # revoked meanwhile, or its user was removed (no ghost viewer)
            raise UnknownToken("the API token is unknown or was revoked; create a new one on the Account page")
        stored.last_used_at = time.time()
        session.add(stored)
        session.commit()
        return Actor(user.name, Role(user.role))


def token_id_of(token: str) -> str:
    """The id part of a token (the row it names), "" when it is not one of ours."""
    parts = token.strip().removeprefix(TOKEN_PREFIX).split("_", 1)
    return parts[0] if token.startswith(TOKEN_PREFIX) and len(parts) == 2 else ""


def stored_hash(store: Store, token_id: str) -> str:
    """The argon2 hash stored for a token id ("" when there is none)."""
    with Session(store.engine) as session:
        row = session.get(ApiToken, token_id)
        return row.token_hash if row is not None else ""


def verified_actor(store: Store, token_id: str, token_hash: str) -> Actor | None:
    """The actor of a token ``user_for_token`` verified before, without verifying it again (argon2 costs a tenth of
    a second and more): its row must still hold the hash that was verified, and the user's role is read now. None
    when the token was revoked or replaced, or its user removed."""
    with Session(store.engine) as session:
        row = session.get(ApiToken, token_id)
        user = session.get(User, row.user) if row is not None and row.token_hash == token_hash else None
        return Actor(user.name, Role(user.role)) if user is not None else None


@dataclass
class Accounts:
    """Users (with the roles admins gave them) and API token hashes: they live only in the database (no run
    folder records them), so ``db rebuild`` carries them over from the database it sets aside."""

    users: list[dict] = field(default_factory=list)
    tokens: list[dict] = field(default_factory=list)


def read_accounts(url: str) -> Accounts | None:
    """The users and tokens of the database at ``url``, read without changing it; None when it cannot be
    read (a corrupt file). A database from before users existed has none."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            tables = inspect(conn)
            users = ([dict(r._mapping) for r in conn.execute(User.__table__.select())]
                     if tables.has_table(User.__tablename__) else [])
            tokens = ([dict(r._mapping) for r in conn.execute(ApiToken.__table__.select())]
                      if tables.has_table(ApiToken.__tablename__) else [])
        return Accounts(users, tokens)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()


def restore_accounts(store: Store, accounts: Accounts) -> None:
    """Write ``accounts`` into a rebuilt (empty) database."""
    with store._write_lock, Session(store.engine) as session:
        session.add_all(User(**row) for row in accounts.users)
        session.flush()  # tokens refer to their users
        session.add_all(ApiToken(**row) for row in accounts.tokens)
        session.commit()

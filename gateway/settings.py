"""Authentication settings, read once and checked fail-closed.

Sources: the environment, then ``.streamlit/secrets.toml`` (the project's, then ``~/.streamlit/``),
the same files ``st.secrets`` reads. A secrets file that exists but does not parse is an error naming
the file and line, never "no password" (which would turn the gate off).

Password mode: ``FINETUNE_STUDIO_PASSWORD`` or ``studio_password`` in secrets.toml.
OIDC mode: ``FINETUNE_STUDIO_OIDC_ISSUER`` (the provider's issuer URL; its
``/.well-known/openid-configuration`` is read), ``FINETUNE_STUDIO_OIDC_CLIENT_ID`` and
``FINETUNE_STUDIO_OIDC_CLIENT_SECRET`` (or ``[oidc]`` ``issuer``/``client_id``/``client_secret`` in
secrets.toml), and ``FINETUNE_STUDIO_PUBLIC_URL`` (the provider sends browsers back to its
``/auth/callback``). Both set: OIDC is used and the password is ignored by the proxy.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from trainer_core.auth import access
from trainer_core.auth.access import Role

PASSWORD_ENV = "FINETUNE_STUDIO_PASSWORD"
PASSWORD_KEY = "studio_password"
OIDC_ENV = {"issuer": "FINETUNE_STUDIO_OIDC_ISSUER", "client_id": "FINETUNE_STUDIO_OIDC_CLIENT_ID",
            "client_secret": "FINETUNE_STUDIO_OIDC_CLIENT_SECRET"}
ADMINS_ENV = "FINETUNE_STUDIO_ADMINS"  # comma-separated user names (OIDC: e-mail addresses) that are admins
DEFAULT_ROLE_ENV = "FINETUNE_STUDIO_DEFAULT_ROLE"  # role of a user seen for the first time
SESSION_HOURS_ENV = "FINETUNE_STUDIO_SESSION_HOURS"
TLS_ENV = {"cert": "FINETUNE_STUDIO_TLS_CERT", "key": "FINETUNE_STUDIO_TLS_KEY"}
# The URL browsers use (required in OIDC mode; otherwise only when it is not nginx's own, e.g. a TLS
# terminator in front of it): its origin is accepted by the Origin check, and OIDC redirects come back to it.
PUBLIC_URL_ENV = "FINETUNE_STUDIO_PUBLIC_URL"
_PUBLIC_URL_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?$")


class SettingsError(ValueError):
    """Authentication is misconfigured: nothing may start. The message names the setting and the fix."""


def read_secrets(files: list[Path] | None = None) -> dict:
    """Merge the secrets files that exist. A file that cannot be read or parsed raises SettingsError."""
    merged: dict = {}
    for path in files if files is not None else access.secrets_files():
        if not path.exists():
            continue
        try:
            merged.update(tomllib.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{path}: cannot be read ({exc}); fix or remove it: authentication stays off "
                                "until it can be read.") from None
        except tomllib.TOMLDecodeError as exc:  # its message says "(at line N, column M)"
            raise SettingsError(f"{path} is not valid TOML: {exc}. Fix that line; nothing starts with a "
                                "secrets file that cannot be read (it may hold the password).") from None
    return merged


def configured_password(secrets: dict | None = None) -> str:
    """The shared password: secrets.toml's ``studio_password``, else ``FINETUNE_STUDIO_PASSWORD``; "" if none."""
    secrets = read_secrets() if secrets is None else secrets
    value = secrets.get(PASSWORD_KEY, "")
    if not isinstance(value, str):
        raise SettingsError(f"{PASSWORD_KEY} in secrets.toml must be a string (put it in quotes).")
    return value or os.environ.get(PASSWORD_ENV, "")


@dataclass
class AuthSettings:
    mode: str  # "password" or "oidc"
    password: str = field(default="", repr=False)
    issuer: str = ""
    client_id: str = ""
    client_secret: str = field(default="", repr=False)
    admins: tuple[str, ...] = ()
    default_role: Role = Role.VIEWER
    session_hours: float = 12.0
    tls_cert: str = ""
    tls_key: str = ""
    public_url: str = ""  # scheme://host[:port], no path; "" = whatever nginx itself serves (password mode)

    def role_for_new_user(self, name: str) -> Role:
        return Role.ADMIN if name in self.admins else self.default_role


def load(environ: dict[str, str] | None = None, secrets: dict | None = None) -> AuthSettings:
    """Settings for the shared mode; every problem at once in one SettingsError."""
    env = os.environ if environ is None else environ
    secrets = read_secrets() if secrets is None else secrets
    problems: list[str] = []
    oidc_table = secrets.get("oidc", {})
    if not isinstance(oidc_table, dict):
        problems.append("[oidc] in secrets.toml must be a table with issuer, client_id and client_secret")
        oidc_table = {}
    oidc = {k: str(env.get(var) or oidc_table.get(k) or "") for k, var in OIDC_ENV.items()}
    password = str(secrets.get(PASSWORD_KEY) or env.get(PASSWORD_ENV, ""))
    mode = "oidc" if any(oidc.values()) else "password"
    if mode == "oidc":
        for key, value in oidc.items():
            if not value:
                problems.append(f"{OIDC_ENV[key]} (or {key} under [oidc] in secrets.toml) is not set: OIDC sign-in "
                                "needs issuer, client id and client secret")
        if oidc["issuer"] and not oidc["issuer"].startswith(("https://", "http://127.0.0.1", "http://localhost")):
            problems.append(f"{OIDC_ENV['issuer']} must be an https:// URL (plain http only for a provider on "
                            "this host)")
    elif not password:
        problems.append(f"no password and no OIDC provider: set {PASSWORD_ENV} (or {PASSWORD_KEY} in "
                        f".streamlit/secrets.toml), or {OIDC_ENV['issuer']}, {OIDC_ENV['client_id']} and "
                        f"{OIDC_ENV['client_secret']}; shared mode never starts without authentication")
    elif len(password) < 8:
        problems.append(f"{PASSWORD_ENV}: the shared password has {len(password)} characters; use at least 8")
    role_name = env.get(DEFAULT_ROLE_ENV, Role.VIEWER.value).strip().lower()
    try:
        default_role = Role(role_name)
    except ValueError:
        problems.append(f"{DEFAULT_ROLE_ENV}={role_name!r}: choose one of {', '.join(r.value for r in Role)}")
        default_role = Role.VIEWER
    try:
        hours = float(env.get(SESSION_HOURS_ENV, "12"))
        if not 0 < hours <= 24 * 30:
            raise ValueError
    except ValueError:
        problems.append(f"{SESSION_HOURS_ENV} must be a number of hours between 0 and 720")
        hours = 12.0
    cert, key = env.get(TLS_ENV["cert"], ""), env.get(TLS_ENV["key"], "")
    if bool(cert) != bool(key):
        problems.append(f"set both {TLS_ENV['cert']} and {TLS_ENV['key']} (certificate and private key) or neither")
    for var, value in ((TLS_ENV["cert"], cert), (TLS_ENV["key"], key)):
        if value and not Path(value).is_file():
            problems.append(f"{var}={value}: no such file")
    public_url = env.get(PUBLIC_URL_ENV, "").strip().rstrip("/")
    if public_url and not _PUBLIC_URL_RE.match(public_url):
        problems.append(f"{PUBLIC_URL_ENV}={public_url!r}: give scheme and host (and port), e.g. "
                        "https://studio.example.com, without a path")
    elif mode == "oidc" and not public_url:
        problems.append(f"{PUBLIC_URL_ENV} is not set: OIDC sign-in needs the URL browsers use (e.g. "
                        "https://studio.example.com) to build its redirect address <URL>/auth/callback, which the "
                        "provider must list; it is never taken from a request's Host header")
    if problems:
        raise SettingsError("Authentication is not configured correctly, so nothing was started:\n- "
                            + "\n- ".join(problems))
    admins = tuple(a.strip() for a in env.get(ADMINS_ENV, "").split(",") if a.strip())
    return AuthSettings(mode=mode, password=password, issuer=oidc["issuer"].rstrip("/"), client_id=oidc["client_id"],
                        client_secret=oidc["client_secret"], admins=admins, default_role=default_role,
                        session_hours=hours, tls_cert=cert, tls_key=key, public_url=public_url)

"""Which judge endpoints and judge keys a job may use: server settings an admin sets, checked in the
dashboard when a spec is validated and again in the worker before every request.

- ``FINETUNE_STUDIO_JUDGE_KEY_ENVS``: comma-separated names of environment variables that hold judge keys.
  ``judge_key_env`` must be one of them; nothing else of the server's environment is ever sent to a judge.
- ``FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE=1``: allow judge URLs whose host resolves to a loopback, private,
  link-local, multicast or otherwise non-public address (a judge on this host or the local network).
  Off by default: a judge URL is user input, and such addresses reach the sign-in service, the database
  and the dashboard itself (server-side request forgery).

Dashboard-safe: standard library only.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

from trainer_core.auth import access

KEY_ENVS_SETTING = "FINETUNE_STUDIO_JUDGE_KEY_ENVS"
ALLOW_PRIVATE_SETTING = "FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE"


class EndpointRefused(ValueError):
    """The judge URL may not be called; the message names the reason and the setting that changes it."""


def declared_key_envs(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return [n.strip() for n in env.get(KEY_ENVS_SETTING, "").split(",") if n.strip()]


def key_env_problem(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why ``name`` may not be read as a judge key, or None when an admin declared it for judging."""
    if name in access.SERVER_SECRET_ENV or name in access.RUN_SECRET_ENV or name in access.secrets_file_keys():
        return (f"{name} holds a secret of the server or of training runs, and the judge URL can be anywhere: "
                f"put the judge's key in a variable of its own (e.g. JUDGE_API_KEY) and have the admin list it in "
                f"{KEY_ENVS_SETTING}")
    if name not in declared_key_envs(environ):
        declared = ", ".join(declared_key_envs(environ)) or "none"
        return (f"{name} is not declared for judging (declared: {declared}): the server's admin lists the variables "
                f"a judge may read in {KEY_ENVS_SETTING} (e.g. {KEY_ENVS_SETTING}=JUDGE_API_KEY); choose one of "
                "those, or leave judge_key_env empty for a judge without a key")
    return None


def private_allowed(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ALLOW_PRIVATE_SETTING, "").strip().lower() in ("1", "true", "yes", "on")


def address_problem(address: str) -> str | None:
    """'loopback', 'private', ... for an address a judge may not be called at by default; None if public."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # a scoped IPv6 address carries its interface after %
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    for name in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{name}"):
            return name.replace("_", "-")
    return None if ip.is_global else "non-public"


@dataclass(frozen=True)
class Target:
    """Where a request goes: the URL with the checked address in place of the host name, and the name for
    the Host header and TLS (so a second DNS answer cannot send the request elsewhere)."""
    url: str
    host: str  # the Host header: the name (and port) of the original URL
    hostname: str  # the name a TLS certificate must match


def resolve(url: str, environ: Mapping[str, str] | None = None) -> Target:
    """The address ``url`` is called at, checked; EndpointRefused names why not."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointRefused(f"{url[:200]} is not an http(s) URL with a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError, UnicodeError) as exc:
        raise EndpointRefused(f"the host {parts.hostname} of the judge URL cannot be resolved "
                              f"({type(exc).__name__}): check the URL") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not private_allowed(environ):
        for address in addresses:  # every answer: a name that resolves to a public AND a private address is refused
            problem = address_problem(address)
            if problem:
                raise EndpointRefused(
                    f"the judge URL's host {parts.hostname} resolves to {address}, a {problem} address: judges on "
                    f"this host or a private network are refused unless the server's admin sets "
                    f"{ALLOW_PRIVATE_SETTING}=1")
    chosen = addresses[0]
    netloc = f"[{chosen}]" if ":" in chosen else chosen
    if parts.port:
        netloc += f":{parts.port}"
    return Target(parts._replace(netloc=netloc).geturl(), parts.netloc.rpartition("@")[2], parts.hostname)


def url_problem(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    try:
        resolve(url, environ)
    except EndpointRefused as exc:
        return str(exc)
    return None

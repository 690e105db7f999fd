"""A server's URL as SpecLens shows, logs and writes it: never with the user:password it may carry (engine/remote/
client.py sends those as Basic auth, off the URL httpx logs), checked once where it enters."""
from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

from engine.remote.errors import RemoteError


def public_url(url: str) -> str:
    """The URL without user:password and without a trailing slash: what may be shown, logged or written."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is no number, or a malformed address: shown without it
        parts, port = urlsplit(url.split("//", 1)[0] + "//" + (parts_host(url) or "")), None
    if not parts.netloc:  # no "//": "user:password@host" would otherwise come back whole as a path
        return parts_host(url) or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?//[^/?#]*@")


def redact(url: str) -> str:
    """A URL as typed, for a message about it: without whatever precedes an @ in its host part (a password),
    and cut short. Works on text that does not parse as a URL, which public_url needs."""
    text = str(url).strip()
    m = _USERINFO.match(text)
    if m:
        text = (m.group(1) or "") + "//" + text[m.end():]
    elif "@" in text.split("/", 1)[0]:  # "user:pw@host" with no scheme
        text = text.split("@", 1)[1]
    return repr(text if len(text) <= 100 else text[:99] + "\u2026")


def parts_host(url: str) -> str | None:
    """The host of a URL that urlsplit cannot take whole, without user:password and port (None: none)."""
    head = str(url).split("//", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    host = head.rsplit(":", 1)[0] if head.count(":") == 1 else head
    return host or None


def check_url(url: str) -> str:
    """http(s) with a host, else RemoteError; returns it without a trailing slash."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as e:
        raise RemoteError(f"{redact(url)} is not a URL ({without_password(str(e), url)})") from None
    if parts.scheme not in ("http", "https"):
        raise RemoteError(f"{redact(url)}: only http:// and https:// servers can be attached")
    if not parts.hostname:
        raise RemoteError(f"{redact(url)} names no host")
    return url.strip().rstrip("/")


def without_password(text: str, url: str) -> str:
    """An error's text with the URL's password taken out (urllib quotes the netloc in some messages)."""
    password = urlsplit_password(url)
    return text.replace(password, "***") if password else text


def urlsplit_password(url: str) -> str | None:
    head = str(url).strip().split("//", 1)[-1].split("/", 1)[0]
    if "@" not in head:
        return None
    userinfo = head.rsplit("@", 1)[0]
    return userinfo.split(":", 1)[1] if ":" in userinfo else None


def credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without user:password, and the pair (None: none given)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rsplit("@", 1)[1]
    return (urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)),
            (unquote(parts.username or ""), unquote(parts.password or "")))

"""Attach mode's backend, built for the controller: a RemoteHost (app/remote_host.py) for a server's URL, and what
the views may know of the attached server as plain values (`Attached`), so that no view or dialog reaches into
engine.remote."""
from __future__ import annotations

import os
from dataclasses import dataclass

from app.host_protocol import Host
from app.remote_host import RemoteHost
from engine.remote.client import KEY_ENV
from engine.remote.errors import RemoteError

__all__ = ["KEY_ENV", "AttachError", "Attached", "attached", "remote_host"]


class AttachError(Exception):
    """A server that cannot be attached to before any connection is tried (a URL that is not http(s))."""


@dataclass(frozen=True)
class Attached:
    """The attached server, as the views see it."""

    url: str  # without credentials: what may be shown and saved
    plain_url: str | None  # the plain server's (the same model without a draft), likewise
    label: str  # its kind, version and URL, e.g. "llama.cpp b6123 at http://127.0.0.1:8080"
    notes: tuple[str, ...]  # what the user should know (e.g. "drafts nothing")
    speculative: bool | None  # a draft model in its slots (None: it does not say)
    per_request_spec: bool | None  # K and on/off honoured per request (None: not asked)

    @property
    def has_plain(self) -> bool:
        return self.plain_url is not None


def remote_host(url: str, plain_url: str | None = None, api_key: str | None = None) -> Host:
    """A host for the server at `url` (not yet connected: its connect_server() probes it). The key: `api_key`,
    else $SPECLENS_API_KEY, else none."""
    try:
        return RemoteHost(url, api_key or os.environ.get(KEY_ENV) or None, plain_url)
    except RemoteError as e:
        raise AttachError(str(e)) from None


def attached(remote: RemoteHost) -> Attached:
    """What a connected server's host tells the views."""
    server = remote.server
    return Attached(remote.client.public, remote.plain.public if remote.plain is not None else None,
                    remote.info.device if remote.info is not None else remote.client.public,
                    tuple(server.notes) if server else (), server.speculative if server else None,
                    server.per_request_spec if server else None)

"""The CLI's way to ``flowforge server``: its URL (``--server``, ``$FLOWFORGE_SERVER``, or
``server:`` in ``$FLOWFORGE_CONFIG``, default ``~/.config/flowforge/config.yaml``) and the
caller's Kubernetes credentials as kubectl finds them (``--token-file`` or
``$FLOWFORGE_TOKEN``, else the bearer token of the kubeconfig's current context, from a
token, a token file or an exec plugin).

The token goes only where the user pointed: over https, or plain http to this machine's
loopback (``kubectl port-forward``) or with ``--allow-http``; never across a redirect (an
answer 3xx is refused, since urllib would forward the Authorization header to any host the
redirect names).

A user reads runs through the server with the permissions Kubernetes gives them; only an
administrator's explicit ``--admin``/``--dsn`` reads the store directly."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode, urlsplit

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from flowforge.cli.output import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE, CommandError

SERVER_VARIABLE: Final = "FLOWFORGE_SERVER"
CONFIG_VARIABLE: Final = "FLOWFORGE_CONFIG"
TOKEN_VARIABLE: Final = "FLOWFORGE_TOKEN"
DEFAULT_CONFIG: Final = Path("~/.config/flowforge/config.yaml")
TIMEOUT_SECONDS: Final = 30.0
STREAM_IDLE_SECONDS: Final = 60.0


def configured_server(args: argparse.Namespace) -> str | None:
    """The server's URL, or None when none is configured."""
    explicit = getattr(args, "server", None) or os.environ.get(SERVER_VARIABLE)
    if explicit:
        return str(explicit).rstrip("/")
    path = Path(os.environ.get(CONFIG_VARIABLE) or DEFAULT_CONFIG).expanduser()
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, yaml.YAMLError) as error:
        raise CommandError(f"{path}: cannot read the configuration: {error}") from error
    server = document.get("server") if isinstance(document, Mapping) else None
    return str(server).rstrip("/") if server else None


def check_server_url(url: str, *, allow_http: bool) -> None:
    """Refuse a URL the token must not be sent to: not http(s), or plain http to another
    machine without ``--allow-http``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandError(
            f"--server {url}: give an https:// URL (or http:// to this machine)",
            exit_code=EXIT_USAGE,
        )
    if parts.scheme == "http" and not allow_http and not _loopback(parts.hostname):
        raise CommandError(
            f"--server {url} is plain http to another machine: the token would cross the "
            "network readable; use https://, or pass --allow-http if the path is trusted",
            exit_code=EXIT_USAGE,
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer_token(args: argparse.Namespace) -> str:
    """``--token-file`` / ``$FLOWFORGE_TOKEN``, else the kubeconfig's current context's."""
    token_file = getattr(args, "token_file", None)
    if token_file:
        try:
            token = Path(token_file).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise CommandError(
                f"--token-file {token_file}: cannot read it: {error}", exit_code=EXIT_USAGE
            ) from error
        if not token:
            raise CommandError(f"--token-file {token_file} is empty", exit_code=EXIT_USAGE)
        return token
    explicit = os.environ.get(TOKEN_VARIABLE)
    if explicit:
        return str(explicit)
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=getattr(args, "kubeconfig", None), client_configuration=configuration
        )
    except (k8s_config.ConfigException, OSError) as error:
        raise CommandError(f"cannot load the kubeconfig: {error}", exit_code=EXIT_USAGE) from error
    # auth_settings() runs the client's refresh hook (exec plugins, rotated token files)
    header = str(configuration.auth_settings().get("BearerToken", {}).get("value") or "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise CommandError(
            "the kubeconfig's current context has no bearer token (a client certificate cannot "
            "be forwarded to the server): pass --token-file, e.g. --token-file <(kubectl create "
            "token NAME)",
            exit_code=EXIT_USAGE,
        )
    return token


def path_of(*parts: str) -> str:
    return "/" + "/".join(quote(part, safe="") for part in parts)


@dataclass(frozen=True)
class ServerClient:
    base_url: str
    token: str

    @classmethod
    def from_args(cls, args: argparse.Namespace, url: str) -> ServerClient:
        check_server_url(url, allow_http=bool(getattr(args, "allow_http", False)))
        return cls(base_url=url, token=bearer_token(args))

    def _open(self, path: str, *, params: Mapping[str, Any] | None, timeout: float) -> Any:
        query = {key: value for key, value in (params or {}).items() if value is not None}
        url = f"{self.base_url}/api/v1{path}" + (f"?{urlencode(query)}" if query else "")
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        try:
            return _OPENER.open(request, timeout=timeout)
        except CommandError:
            raise
        except urllib.error.HTTPError as error:
            raise _refusal(error) from error
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise CommandError(
                f"cannot reach flowforge server at {self.base_url}: {reason}",
                exit_code=EXIT_UNAVAILABLE,
            ) from error

    def get(self, path: str, **params: Any) -> Any:
        with self._open(path, params=params, timeout=TIMEOUT_SECONDS) as response:
            return json.loads(response.read())

    def text(self, path: str, **params: Any) -> str:
        with self._open(path, params=params, timeout=TIMEOUT_SECONDS) as response:
            return str(response.read().decode(errors="replace"))

    def stream(self, path: str) -> Iterator[tuple[str, Any]]:
        """The server-sent events of ``path``: (event, data) until the server ends it."""
        with self._open(path, params=None, timeout=STREAM_IDLE_SECONDS) as response:
            kind = ""
            for raw in response:
                line = raw.decode(errors="replace").rstrip("\n")
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    yield kind, json.loads(line.removeprefix("data: "))


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is refused, never followed with the token."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        raise CommandError(
            f"server: answered HTTP {code} redirecting to {newurl}; the token is not sent "
            "across redirects: give the final URL as --server",
            exit_code=EXIT_FAILED,
        )


_OPENER: Final = urllib.request.build_opener(_NoRedirects)


def _refusal(error: urllib.error.HTTPError) -> CommandError:
    try:
        message = str(json.loads(error.read())["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {error.code} {error.reason}"
    code = EXIT_UNAVAILABLE if error.code >= 500 else EXIT_FAILED
    if error.code == 401:
        message += " (sign in: --token-file, or a kubeconfig context with a token)"
    return CommandError(f"server: {message}", exit_code=code)

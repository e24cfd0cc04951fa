"""The CLI's way to ``flowforge server``: its URL (``--server``, ``$FLOWFORGE_SERVER``, or
``server:`` in ``$FLOWFORGE_CONFIG``, default ``~/.config/flowforge/config.yaml``) and the
caller's Kubernetes credentials as kubectl finds them (``--token``, else the bearer token of
the kubeconfig's current context, from a token, a token file or an exec plugin).

A user reads runs through the server with the permissions Kubernetes gives them; only an
administrator's explicit ``--admin``/``--dsn`` reads the store directly."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode

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


def bearer_token(args: argparse.Namespace) -> str:
    """``--token`` / ``$FLOWFORGE_TOKEN``, else the kubeconfig's current context's token."""
    explicit = getattr(args, "token", None) or os.environ.get(TOKEN_VARIABLE)
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
            'be forwarded to the server): pass --token, e.g. --token "$(kubectl create token '
            'NAME)"',
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
        return cls(base_url=url, token=bearer_token(args))

    def _open(self, path: str, *, params: Mapping[str, Any] | None, timeout: float) -> Any:
        query = {key: value for key, value in (params or {}).items() if value is not None}
        url = f"{self.base_url}/api/v1{path}" + (f"?{urlencode(query)}" if query else "")
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        try:
            return urllib.request.urlopen(request, timeout=timeout)
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


def _refusal(error: urllib.error.HTTPError) -> CommandError:
    try:
        message = str(json.loads(error.read())["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {error.code} {error.reason}"
    code = EXIT_UNAVAILABLE if error.code >= 500 else EXIT_FAILED
    if error.code == 401:
        message += " (sign in: --token, or a kubeconfig context with a token)"
    return CommandError(f"server: {message}", exit_code=code)

"""A minimal HTTPS client for the local apiserver, authenticated by the
kubeconfig's client certificate. Enough for readiness probes and bootstrapping
without spawning kubectl for every poll."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

JsonObject = dict[str, Any]


class LocalApiClient:
    def __init__(self, kubeconfig: Path, *, timeout: float = 5.0) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server: str = cluster["server"]
        self._timeout = timeout
        self._context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self._context.load_cert_chain(user["client-certificate"], user["client-key"])

    def request(self, method: str, path: str, body: JsonObject | None = None) -> tuple[int, str]:
        """Status code and body text; connection failures raise OSError."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(
                request, context=self._context, timeout=self._timeout
            ) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode(errors="replace")

    def get_json(self, path: str) -> JsonObject | None:
        """The object at path, or None when it does not exist (yet)."""
        status, text = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {text[:300]}")
        result: JsonObject = json.loads(text)
        return result

    def create(self, path: str, body: JsonObject) -> None:
        """POST body to the collection at path; AlreadyExists counts as success."""
        status, text = self.request("POST", path, body)
        if status not in (200, 201, 202, 409):
            raise RuntimeError(f"POST {path}: HTTP {status}: {text[:300]}")

    def is_ready(self) -> bool:
        try:
            status, text = self.request("GET", "/readyz")
        except OSError:
            return False
        return status == 200 and text.strip() == "ok"

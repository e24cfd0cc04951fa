"""The CLI's token goes only where the user pointed, and destructive cutoffs are sane:

- plain http to another machine is refused before the token is read (``--allow-http``
  says otherwise; this machine's loopback, the port-forward case, is allowed);
- a redirect is refused, and the host it names never sees the token;
- a token on argv is refused by the parser; ``--token-file`` is read instead;
- ``db prune --older-than 0s`` (anything under an hour) is refused.
"""

from __future__ import annotations

import argparse
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flowforge.cli.api_client import ServerClient, bearer_token, check_server_url
from flowforge.cli.main import build_parser
from flowforge.cli.output import CommandError

TOKEN = "eyJhbGciOiJSUzI1NiJ9.secret.token"


def _args(**values: object) -> argparse.Namespace:
    defaults: dict[str, object] = {"token_file": None, "allow_http": False, "kubeconfig": None}
    return argparse.Namespace(**{**defaults, **values})


@pytest.mark.parametrize(
    "url", ["http://flowforge.example.com", "http://10.0.0.7:8080", "http://[fd00::1]"]
)
def test_plain_http_to_another_machine_is_refused_before_the_token_is_read(
    url: str, tmp_path: Path
) -> None:
    never_read = tmp_path / "missing-token"  # reading it would fail differently
    with pytest.raises(CommandError, match="plain http to another machine"):
        ServerClient.from_args(_args(token_file=str(never_read)), url)
    check_server_url(url, allow_http=True)  # the user's explicit choice


@pytest.mark.parametrize(
    "url", ["https://flowforge.example.com", "http://127.0.0.1:8080", "http://localhost:8080"]
)
def test_https_and_this_machines_loopback_are_accepted(url: str) -> None:
    check_server_url(url, allow_http=False)


@pytest.mark.parametrize("url", ["ftp://flowforge.example.com", "file:///etc/passwd", "http://"])
def test_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(CommandError, match="give an https:// URL"):
        check_server_url(url, allow_http=True)


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None]
    location = ""

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        if self.location:
            self.send_response(302)
            self.send_header("Location", self.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        return None


@contextmanager
def _server(location: str = "") -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Handler", (_Recorder,), {"seen": seen, "location": location})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_redirect_is_refused_and_its_target_never_sees_the_token() -> None:
    with _server() as (elsewhere, seen_elsewhere):
        with _server(location=f"{elsewhere}/api/v1/whoami") as (url, seen):
            client = ServerClient(base_url=url, token=TOKEN)
            with pytest.raises(CommandError, match="not sent across redirects"):
                client.get("/whoami")
        assert seen == [f"Bearer {TOKEN}"]
        assert seen_elsewhere == []
        # the same client reaches a server that answers directly
        assert ServerClient(base_url=elsewhere, token=TOKEN).get("/whoami") == {}
        assert seen_elsewhere == [f"Bearer {TOKEN}"]


def test_a_token_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["get", "runs", "--token", TOKEN])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "use --token-file FILE" in err
    assert TOKEN not in err


def test_the_token_is_read_from_the_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWFORGE_TOKEN", "from-the-environment")
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    args = build_parser().parse_args(["get", "runs", "--token-file", str(path)])
    assert bearer_token(args) == TOKEN  # the file wins over the environment
    path.write_text("\n")
    with pytest.raises(CommandError, match="is empty"):
        bearer_token(args)


@pytest.mark.parametrize("age", ["0s", "59m", "3599s"])
def test_prune_refuses_a_cutoff_under_an_hour(age: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["db", "prune", "--older-than", age])
    assert raised.value.code == 2
    assert f"--older-than {age} is under 1h" in capsys.readouterr().err


def test_prune_accepts_an_hour_or_more() -> None:
    args = build_parser().parse_args(["db", "prune", "--older-than", "1h"])
    assert args.older_than.total_seconds() == 3600

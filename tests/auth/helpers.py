"""What the login tests share: options from a plain dict, an OAuth 2 token endpoint on loopback, JWTs the
TLS node accepts, a TLS front for the embedded broker, and the TLS node's view of its connections."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import math
import os
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from spark_amqp.option_reader import OptionReader
from spark_amqp.transport.options import CONNECTION_KEYS, ConnectionOptions, parse_connection

from .. import brokers

CLIENT_ID = "spark-etl"
CLIENT_SECRET = "cl1ent-s3cret-never-shown"


def options(uri: str, **extra: object) -> ConnectionOptions:
    """Connection options as a data source would parse them (stream-protocol uris taken)."""
    return parse_connection(OptionReader({"uri": uri, **{k: str(v) for k, v in extra.items()}}, CONNECTION_KEYS), stream_protocol=True)


def without_credentials(url: str) -> str:
    """``amqps://guest:guest@127.0.0.1:5693/%2F`` -> ``amqps://127.0.0.1:5693/%2F``."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}"


def tls_node() -> tuple[str, str, str]:
    """(amqps:// uri, rabbitmq-stream+tls:// uri, certificates folder) of the TLS node, without credentials."""
    if not (brokers.TLS_URL and brokers.TLS_STREAM_URL and brokers.TLS_DIR):
        pytest.skip("AMQP_TEST_TLS_URL, AMQP_TEST_TLS_STREAM_URL and AMQP_TEST_TLS_DIR not set: no TLS node")
    return without_credentials(brokers.TLS_URL), without_credentials(brokers.TLS_STREAM_URL), brokers.TLS_DIR


def oauth_node() -> tuple[str, str, str]:
    """(amqp:// uri, rabbitmq-stream:// uri, certificates folder) of the TLS node's plain listeners, without credentials."""
    if not (brokers.OAUTH_URL and brokers.OAUTH_STREAM_URL and brokers.TLS_DIR):
        pytest.skip("AMQP_TEST_OAUTH_URL, AMQP_TEST_OAUTH_STREAM_URL and AMQP_TEST_TLS_DIR not set: no OAuth 2 node")
    return without_credentials(brokers.OAUTH_URL), without_credentials(brokers.OAUTH_STREAM_URL), brokers.TLS_DIR


def cert(tls_dir: str, name: str) -> dict[str, str]:
    """The options for client certificate ``name`` (certuser, guest, untrusted, expired) and the node's CA."""
    return {"tls.caFile": f"{tls_dir}/ca.pem", "tls.certFile": f"{tls_dir}/{name}.pem", "tls.keyFile": f"{tls_dir}/{name}-key.pem"}


def signer(tls_dir: str, audience: str = "rabbitmq", key_file: str = "oauth-private.pem") -> Callable[[float], str]:
    """RS256 JWTs as the TLS node's OAuth 2 backend takes them, each valid for the given seconds."""
    jwt = pytest.importorskip("jwt")  # pyjwt: in the [test] extra, not in every lane's venv

    with open(os.path.join(tls_dir, key_file)) as f:
        key = f.read()
    with open(os.path.join(tls_dir, "oauth-key-id.txt")) as f:
        kid = f.read().strip()

    def make(lifetime: float) -> str:
        now = time.time()
        claims = {
            "aud": audience,
            "sub": "spark-etl",
            "scope": "rabbitmq.read:*/* rabbitmq.write:*/* rabbitmq.configure:*/*",
            "iat": int(now),
            "exp": math.ceil(now + lifetime),  # never before the expiry the endpoint announces
            "jti": uuid.uuid4().hex,  # two tokens of the same second differ
        }
        return str(jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid}))

    return make


class TokenServer:
    """A token endpoint on loopback (the client-credentials grant), serving ``make(lifetime)`` tokens.

    ``refusing``: answer 401 invalid_client; ``failing``: answer 503. ``issued`` counts tokens given."""

    def __init__(self, make: Callable[[float], str], lifetime: float = 60.0) -> None:
        self.make = make
        self.lifetime = lifetime
        self.refusing = False
        self.failing = False
        self.issued = 0
        self.given: list[str] = []  # every token issued, to look for where none may be
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                form = dict(urllib.parse.parse_qsl(body))
                auth = self.headers.get("Authorization", "")
                server.requests.append({"form": form, "authorization": auth, "path": self.path})
                expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
                if server.failing:
                    self._answer(503, {"error": "temporarily_unavailable"})
                elif server.refusing or auth != expected or form.get("grant_type") != "client_credentials":
                    # An endpoint that echoes what it was sent must not get the secret into our errors.
                    self._answer(401, {"error": "invalid_client", "error_description": f"client disabled ({CLIENT_SECRET})"})
                else:
                    with server._lock:
                        server.issued += 1
                    token = server.make(server.lifetime)
                    server.given.append(token)
                    self._answer(200, {"access_token": token, "token_type": "Bearer", "expires_in": server.lifetime})

            def _answer(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, name="token-endpoint", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/oauth2/token"

    def options(self, **extra: object) -> dict[str, str]:
        return {
            "oauth2.tokenEndpoint": self.url,
            "oauth2.clientId": CLIENT_ID,
            "oauth2.clientSecret": CLIENT_SECRET,
            **{k: str(v) for k, v in extra.items()},
        }

    def __enter__(self) -> TokenServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()


class TlsFront:
    """TLS in front of a plain port (the embedded broker's): the TLS node's server certificate, client
    certificates asked for and verified against its CA, bytes passed both ways."""

    def __init__(self, target_port: int, tls_dir: str) -> None:
        self.target_port = target_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=f"{tls_dir}/ca.pem")
        self.context.load_cert_chain(f"{tls_dir}/server.pem", f"{tls_dir}/server-key.pem")
        self.context.verify_mode = ssl.CERT_OPTIONAL
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front", daemon=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def __enter__(self) -> TlsFront:
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context), self._loop).result(
            10
        )
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def connections(name: str, stream: bool = False) -> list[tuple[str, str]]:
    """(mechanism, user) of each of the TLS node's connections whose client name is ``name``."""
    command = "list_stream_connections" if stream else "list_connections"
    out = brokers.tls_ctl(command, "-q", "--formatter", "json", "client_properties", "auth_mechanism", "user")
    found = []
    for item in json.loads(out or "[]"):
        names = [
            p[-1] for p in item.get("client_properties", []) if p[0] == "connection_name"
        ]  # (key, type, value); AMQP 1.0: (key, value)
        if name in names:
            found.append((item["auth_mechanism"], item["user"]))
    return found


def wait_until(check: Callable[[], bool], timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return check()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def unique(stem: str) -> str:
    return f"test.{stem}.{uuid.uuid4().hex[:8]}"

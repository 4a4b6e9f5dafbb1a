"""Connections of `specbench serve`, the plumbing under its routes: HTTP/1.1 keep-alive on the
stdlib's http.server, hostile or broken clients answered with an HTTP error in the API's JSON
shape rather than a dropped connection or a stuck handler.

- A request must arrive within the read timeout (`--read-timeout`) of its first byte (408
  otherwise: a Content-Length larger than the body, headers sent a byte at a time) and an idle
  keep-alive connection is closed after as long; from the headers on, the socket's timeout
  bounds writes.
- Malformed headers and bodies (a missing or conflicting Content-Length, chunked request
  bodies, a body over `MAX_BODY_BYTES`, a wrong Content-Type, http.server's own refusals) get a
  4xx naming the header; a refused request's unread body is drained before the close, so the
  client reads the error instead of a TCP reset.

Boundary: bytes and JSON on a socket; which routes exist is `specbench.server.api`'s.
"""

from __future__ import annotations

import io
import json
import re
import select
import socket
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from specbench.server.requests import ApiError, decode_json

MAX_BODY_BYTES = 32 << 20
# A request's line, headers and body must arrive within this many seconds of its first byte
# (--read-timeout); an idle keep-alive connection closes after as long without a new request.
READ_TIMEOUT_S = 30.0


class RequestTimeout(Exception):
    """A request whose line, headers or body did not arrive within the read timeout."""


class _TimedSocketIO(socket.SocketIO):
    """A connection's reads under one deadline per request: waiting for a request's first
    byte is an idle keep-alive wait (`limit_s`, then http.server closes the connection
    quietly); from that byte on, the rest of the request must arrive within `limit_s`, however
    slowly it trickles in (a Content-Length larger than the body, headers sent a byte at a
    time): RequestTimeout, answered 408, instead of a handler blocked forever."""

    def __init__(self, sock: socket.socket, limit_s: float):
        super().__init__(sock, "rb")
        self.limit_s = limit_s
        self.deadline: float | None = None  # None: between requests

    def readinto(self, b: Any) -> int | None:
        if self.deadline is None:
            self._sock.settimeout(self.limit_s)
            n = super().readinto(b)  # TimeoutError: an idle connection, closed quietly
            if n:
                self.deadline = time.monotonic() + self.limit_s
            return n
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RequestTimeout
        self._sock.settimeout(left)
        try:
            return super().readinto(b)
        except TimeoutError:
            raise RequestTimeout from None


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler whose server has `read_timeout_s` and `verbose`: reads JSON bodies
    under the request's deadline and answers in JSON (errors as OpenAI's error object) or
    server-sent events."""

    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked transfer encoding
    disable_nagle_algorithm = True  # small SSE chunks must leave at once
    server_version = "specbench"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    # ---- plumbing -------------------------------------------------------------------------

    head_only = False  # answering HEAD: headers as for GET, no body
    body_pending = False  # a refused request's body may still be on its way (see _linger)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # replaced: the same socket, read under the request's deadline
        self._io = _TimedSocketIO(self.connection, self.server.read_timeout_s)
        self.rfile = io.BufferedReader(self._io)

    def handle_one_request(self) -> None:
        self._io.deadline = None
        self.body_pending = False
        self.request_version, self.requestline, self.command = self.protocol_version, "", ""
        try:
            super().handle_one_request()
        except RequestTimeout:
            self.connection.settimeout(self.server.read_timeout_s)
            try:
                self._error(408, f"the request's line and headers did not arrive within "
                            f"{self.server.read_timeout_s:g} s (--read-timeout)", "RequestTimeoutError")
            except OSError:
                pass
        if self.body_pending and self.close_connection:
            self._linger()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        # Headers read: from here on the socket's timeout bounds writes (a client that reads
        # nothing for that long is dropped); reading a body re-arms the request's deadline.
        self.connection.settimeout(self.server.read_timeout_s)
        return ok

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long or too many,
        an unknown method) in the API's JSON error shape."""
        status = HTTPStatus(code)
        text = message or status.phrase
        if explain and explain not in text:
            text = f"{text}: {explain}"
        self.body_pending = True  # whatever followed the headers was not read
        if not self.request_version.startswith("HTTP/1."):  # answer with a status line, not as HTTP/0.9
            self.request_version = "HTTP/1.1"
        self._error(code, text, status.phrase.title().replace(" ", "").replace("-", "") + "Error")

    def _linger(self) -> None:
        """Drain what is left of a refused request before closing: closing a socket with unread
        bytes sends a TCP reset, which can destroy the error response before the client reads
        it (a 413 for a body the client is still sending). Bounded in time and bytes."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.5)
            end, left = time.monotonic() + 2.0, 2 * MAX_BODY_BYTES
            while left > 0 and time.monotonic() < end:
                chunk = self.connection.recv(1 << 16)
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _read_body(self) -> Any:
        """The request's JSON body; ApiError names the header or what is wrong with the JSON.
        Chunked request bodies are refused (411): JSON clients send a Content-Length."""
        self.body_pending = True
        if self.headers.get("Transfer-Encoding") is not None:
            if self.headers.get("Content-Length") is not None:
                raise ApiError(400, "Transfer-Encoding and Content-Length together are ambiguous; "
                               "send the body with a Content-Length only")
            raise ApiError(411, "a Content-Length header is required (request bodies with "
                           "Transfer-Encoding, such as chunked, are not supported)", "LengthRequiredError")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            self.body_pending = False
            raise ApiError(411, "a Content-Length header is required", "LengthRequiredError")
        if len({v.strip() for v in lengths}) != 1 or not re.fullmatch(r"[0-9]{1,20}", lengths[0].strip()):
            raise ApiError(400, "the Content-Length header must be one non-negative integer, got "
                           + ", ".join(repr(v) for v in lengths))
        length = int(lengths[0])
        if length > MAX_BODY_BYTES:
            raise ApiError(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES} "
                           "(Content-Length)", "RequestTooLargeError")
        try:
            raw = self.rfile.read(length)
        except RequestTimeout:
            self.body_pending = False
            raise ApiError(408, f"the body did not arrive within {self.server.read_timeout_s:g} s "
                           f"(Content-Length: {length}; --read-timeout)", "RequestTimeoutError") from None
        self.body_pending = False
        self.connection.settimeout(self.server.read_timeout_s)  # now: the timeout of writes
        if len(raw) < length:  # the client closed its side early
            raise ApiError(400, f"the body ended after {len(raw)} of {length} bytes (Content-Length)")
        ctype = self.headers.get("Content-Type")
        media = (ctype or "application/json").split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ApiError(415, f"the Content-Type header must be application/json, got {ctype!r}",
                           "UnsupportedMediaTypeError")
        return decode_json(raw)

    def _client_gone(self) -> bool:
        """Whether the client closed its connection (EOF or a reset), without consuming
        anything it may have sent."""
        poller = select.poll()  # not select(): descriptors beyond 1024 are common here
        poller.register(self.connection, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def _send(self, status: int, body: bytes, ctype: str | None, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        if ctype is not None:
            self.send_header("Content-Type", ctype)
        if status != 204:
            self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not self.head_only and status != 204:
            self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json", headers)

    def _error(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None,
               headers: dict[str, str] | None = None) -> None:
        self.close_connection = True  # the body may be unread: do not reuse the connection
        self._json(status, {"error": {"message": message, "type": type_, "param": param, "code": status}}, headers)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n")

    def _event(self, obj: Any) -> None:
        self._write_chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

"""A client that really reads slowly: a tiny TCP receive window, reads in bursts.

An HTTP client library reads whatever the kernel has as fast as its loop
runs, so however slowly a test consumes the body, the server's writes never
wait. `read_slowly` uses a blocking socket whose receive buffer is set tiny
before connecting (so the window the server sees is tiny too), reads
`burst_bytes` at a time and sleeps `pause_s` between bursts: once the
server's own buffers are full, its transport pauses, as with a client on a
slow link. Run it in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import orjson


def read_slowly(
    url: str,
    body: dict,
    *,
    burst_bytes: int = 256,
    pause_s: float = 0.1,
    receive_buffer_bytes: int | None = 1024,
    timeout_s: float = 600.0,
    before_reading: Callable[[], object] | None = None,
) -> tuple[int, bytes]:
    """POST `body` as JSON to `url`; the status and the (de-chunked) body.
    `receive_buffer_bytes` None keeps the OS's; `before_reading` runs once the
    request is sent, before the first byte is read."""
    parts = urlsplit(url)
    payload = orjson.dumps(body)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if receive_buffer_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        sock.settimeout(timeout_s)
        sock.connect((parts.hostname, parts.port))
        head = (
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.hostname}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        sock.sendall(head.encode() + payload)
        if before_reading is not None:
            before_reading()
        received = bytearray()
        while chunk := sock.recv(burst_bytes):
            received += chunk
            if pause_s:
                time.sleep(pause_s)
    return _parse_response(bytes(received))


def _parse_response(raw: bytes) -> tuple[int, bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])
    }
    if headers.get(b"transfer-encoding") != b"chunked":
        return status, rest
    body = bytearray()
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return status, bytes(body)
        body += rest[:size]
        rest = rest[size + 2 :]

"""A minimal RFC 6455 WebSocket client over a plain socket (standard library only).

What it does: the opening handshake (checking Sec-WebSocket-Accept), masked client frames,
the three payload length encodings, fragmented messages, text validated as UTF-8, ping answered
by pong, and the closing handshake. What it does not: extensions (a server that sets a reserved
bit is refused), subprotocols, redirects, proxies.

Reads never hold a partial frame across a timeout: bytes go into a buffer, and a frame is taken
out of it only once it is whole, so a recv() that times out can simply be called again.
"""

from __future__ import annotations

import base64
import hashlib
import os
import select
import socket
import struct
import threading
import time
from typing import Dict, List, Mapping, Optional, Tuple

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_INVALID_DATA = 1007
CLOSE_TOO_BIG = 1009

MAX_MESSAGE_BYTES = 64 << 20  # a larger message (whole, after reassembly) fails the connection
MAX_RESPONSE_HEAD_BYTES = 64 << 10
MAX_REFUSAL_BODY_BYTES = 1 << 20


class WebSocketError(Exception):
    """The connection broke the protocol, or was used after it closed. `code` is the close code
    sent to the server for a protocol violation (None otherwise)."""

    def __init__(self, message: str, code: Optional[int] = None):
        super().__init__(message)
        self.code = code


class HandshakeRefused(Exception):
    """The server answered the upgrade with something other than 101 (e.g. 401, 404)."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes):
        super().__init__(f"the server answered the WebSocket upgrade with HTTP {status}")
        self.status = status
        self.headers = headers
        self.body = body


def accept_key(key: str) -> str:
    """The Sec-WebSocket-Accept a server must answer to `key`."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode("ascii")).digest()).decode("ascii")


def mask_bytes(data: bytes, mask: bytes) -> bytes:
    """XORs `data` with the 4-byte `mask` repeated (masking and unmasking are the same)."""
    n = len(data)
    if n == 0:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def encode_frame(opcode: int, payload: bytes, fin: bool = True,
                 mask: Optional[bytes] = None) -> bytes:
    """One frame. Clients must mask (pass a 4-byte mask); servers must not (mask=None)."""
    n = len(payload)
    head = bytearray([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask is not None else 0
    if n < 126:
        head.append(bit | n)
    elif n < 65536:
        head.append(bit | 126)
        head += struct.pack("!H", n)
    else:
        head.append(bit | 127)
        head += struct.pack("!Q", n)
    if mask is None:
        return bytes(head) + payload
    return bytes(head) + mask + mask_bytes(payload, mask)


def parse_frame(buf: bytearray, expect_masked: bool) -> Optional[Tuple[bool, int, bytes, int]]:
    """(fin, opcode, payload, frame length) of the whole frame at the start of `buf`, or None
    when it is not all there yet. Raises WebSocketError (with a close code as args[1]) for a
    frame that breaks the protocol."""
    if len(buf) < 2:
        return None
    b0, b1 = buf[0], buf[1]
    fin = bool(b0 & 0x80)
    if b0 & 0x70:
        raise WebSocketError("a frame has a reserved bit set (no extension was agreed)",
                             CLOSE_PROTOCOL_ERROR)
    opcode = b0 & 0x0F
    masked = bool(b1 & 0x80)
    if masked != expect_masked:
        raise WebSocketError("a server frame is masked" if masked else "a client frame is not masked",
                             CLOSE_PROTOCOL_ERROR)
    length = b1 & 0x7F
    pos = 2
    if length == 126:
        if len(buf) < 4:
            return None
        length = struct.unpack_from("!H", buf, 2)[0]
        pos = 4
    elif length == 127:
        if len(buf) < 10:
            return None
        length = struct.unpack_from("!Q", buf, 2)[0]
        if length >> 63:
            raise WebSocketError("a frame's 64-bit length has its top bit set", CLOSE_PROTOCOL_ERROR)
        pos = 10
    if opcode >= 0x8:
        if length > 125:
            raise WebSocketError("a control frame is longer than 125 bytes", CLOSE_PROTOCOL_ERROR)
        if not fin:
            raise WebSocketError("a control frame is fragmented", CLOSE_PROTOCOL_ERROR)
    if length > MAX_MESSAGE_BYTES:
        raise WebSocketError(f"a frame of {length} bytes is over the limit", CLOSE_TOO_BIG)
    mask = b""
    if masked:
        if len(buf) < pos + 4:
            return None
        mask = bytes(buf[pos:pos + 4])
        pos += 4
    end = pos + length
    if len(buf) < end:
        return None
    payload = bytes(buf[pos:end])
    if masked:
        payload = mask_bytes(payload, mask)
    return fin, opcode, payload, end


class WebSocket:
    """A client connection after a successful handshake (see `handshake`).

    recv() and send() may be called from different threads (one reader, any number of senders).
    Pings are answered while receiving. After the server's close frame, recv() returns None.
    """

    def __init__(self, sock: socket.socket, leftover: bytes = b""):
        self._sock = sock
        self._buf = bytearray(leftover)
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._fragments: Optional[Tuple[int, bytearray]] = None
        self._eof = False
        self._close_sent = False
        self._close_received = False
        self._closed = False
        self.close_code: Optional[int] = None
        self.close_reason = ""

    # --- sending ---

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        frame = encode_frame(opcode, payload, mask=os.urandom(4))
        with self._send_lock:
            if self._closed:
                raise WebSocketError("the WebSocket is closed")
            if self._close_sent:
                raise WebSocketError("the WebSocket is closing: no more messages can be sent")
            if opcode == OP_CLOSE:
                self._close_sent = True
            self._sock.sendall(frame)

    def send_text(self, text: str) -> None:
        self._send_frame(OP_TEXT, text.encode("utf-8"))

    def send_binary(self, data: bytes) -> None:
        self._send_frame(OP_BINARY, bytes(data))

    def ping(self, payload: bytes = b"") -> None:
        self._send_frame(OP_PING, payload)

    # --- receiving ---

    def _fill(self, deadline: Optional[float]) -> None:
        """Reads what the socket has into the buffer; socket.timeout past `deadline`."""
        pending = getattr(self._sock, "pending", None)  # ssl sockets may hold decrypted bytes
        try:
            if not (pending and pending()):
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select([self._sock], [], [], remaining)
                if not ready:
                    raise socket.timeout("timed out")
            data = self._sock.recv(1 << 16)
        except (OSError, ValueError):
            if not self._closed:
                raise
            data = b""  # close() from another thread shut the socket
        if not data:
            self._eof = True
        else:
            self._buf += data

    def _fail(self, message: str, code: int) -> WebSocketError:
        """Sends a close with `code` (best effort), drops the connection, returns the error."""
        try:
            if not self._close_sent:
                self._send_frame(OP_CLOSE, struct.pack("!H", code))
        except (OSError, WebSocketError):
            pass
        self._shutdown()
        return WebSocketError(message, code)

    def recv(self, timeout: Optional[float] = None) -> Optional[Tuple[int, bytes]]:
        """The next message as (OP_TEXT or OP_BINARY, payload), or None once the server has
        closed (its close code is in close_code). socket.timeout when nothing whole arrived
        within `timeout` seconds (None: wait as long as it takes); nothing is lost then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._recv_lock:
            return self._recv_locked(deadline)

    def _recv_locked(self, deadline: Optional[float]) -> Optional[Tuple[int, bytes]]:
        while True:
            if self._close_received or self._closed:
                return None
            try:
                frame = parse_frame(self._buf, expect_masked=False)
            except WebSocketError as e:
                raise self._fail(str(e), e.code or CLOSE_PROTOCOL_ERROR) from None
            if frame is None:
                if self._eof:
                    self._shutdown()
                    if self.close_code is None:
                        self.close_code = 1006  # closed without a close frame
                    return None
                self._fill(deadline)
                continue
            fin, opcode, payload, size = frame
            del self._buf[:size]
            message = self._handle(fin, opcode, payload)
            if message is not None:
                return message

    def _handle(self, fin: bool, opcode: int, payload: bytes) -> Optional[Tuple[int, bytes]]:
        if opcode == OP_PING:
            try:
                self._send_frame(OP_PONG, payload)
            except WebSocketError:
                pass  # closing: a pong is no longer owed
            return None
        if opcode == OP_PONG:
            return None
        if opcode == OP_CLOSE:
            self._on_close(payload)
            return None
        if opcode in (OP_TEXT, OP_BINARY):
            if self._fragments is not None:
                raise self._fail("a new message began inside a fragmented one",
                                 CLOSE_PROTOCOL_ERROR)
            if fin:
                return self._complete(opcode, payload)
            self._fragments = (opcode, bytearray(payload))
            return None
        if opcode == OP_CONTINUATION:
            if self._fragments is None:
                raise self._fail("a continuation frame without a message to continue",
                                 CLOSE_PROTOCOL_ERROR)
            first, data = self._fragments
            data += payload
            if len(data) > MAX_MESSAGE_BYTES:
                raise self._fail(f"a message is over {MAX_MESSAGE_BYTES} bytes", CLOSE_TOO_BIG)
            if not fin:
                return None
            self._fragments = None
            return self._complete(first, bytes(data))
        raise self._fail(f"a frame has the reserved opcode {opcode:#x}", CLOSE_PROTOCOL_ERROR)

    def _complete(self, opcode: int, payload: bytes) -> Tuple[int, bytes]:
        if opcode == OP_TEXT:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise self._fail("a text message is not UTF-8", CLOSE_INVALID_DATA) from None
        return opcode, payload

    def _on_close(self, payload: bytes) -> None:
        self._close_received = True
        if len(payload) >= 2:
            self.close_code = struct.unpack_from("!H", payload)[0]
            self.close_reason = payload[2:].decode("utf-8", "replace")
        else:
            self.close_code = 1005  # no status in the frame
        if not self._close_sent:
            try:
                echo = struct.pack("!H", self.close_code) if len(payload) >= 2 else b""
                self._send_frame(OP_CLOSE, echo)
            except (OSError, WebSocketError):
                pass
        # The server closes the TCP connection after the close handshake; waiting for that is
        # close()'s business, so a recv() after an exit event returns at once.

    # --- closing ---

    @property
    def closed(self) -> bool:
        return self._closed or self._close_received

    def close(self, code: int = CLOSE_NORMAL, reason: str = "", timeout: float = 2.0) -> None:
        """The closing handshake: sends a close frame (unless one was sent), waits up to
        `timeout` seconds for the server's (discarding messages that still arrive), then closes
        the socket. Idempotent; never raises for a connection that is already gone."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        try:
            if not self._close_sent:
                self._send_frame(OP_CLOSE, struct.pack("!H", code) + reason.encode("utf-8")[:123])
            # Another thread blocked in recv() holds the lock: shutting the socket wakes it.
            if self._recv_lock.acquire(timeout=timeout):
                try:
                    while not self._close_received and not self._eof and not self._closed:
                        if deadline - time.monotonic() <= 0:
                            break
                        self._recv_locked(deadline)
                finally:
                    self._recv_lock.release()
        except (OSError, WebSocketError):
            pass
        self._shutdown()

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def _read_head(sock: socket.socket, deadline: float) -> Tuple[bytes, bytes]:
    """The response head (through the blank line) and whatever followed it."""
    data = bytearray()
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            return bytes(data[:end + 4]), bytes(data[end + 4:])
        if len(data) > MAX_RESPONSE_HEAD_BYTES:
            raise WebSocketError("the upgrade response's head is too long")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out")
        sock.settimeout(remaining)
        chunk = sock.recv(1 << 14)
        if not chunk:
            raise WebSocketError("the server closed the connection during the upgrade")
        data += chunk


def _read_refusal_body(sock: socket.socket, headers: Mapping[str, str], rest: bytes,
                       deadline: float) -> bytes:
    body = bytearray(rest)
    length = headers.get("content-length")
    want = int(length) if length and length.isdigit() else MAX_REFUSAL_BODY_BYTES
    want = min(want, MAX_REFUSAL_BODY_BYTES)
    try:
        while len(body) < want:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            chunk = sock.recv(1 << 14)
            if not chunk:
                break
            body += chunk
    except OSError:
        pass
    return bytes(body[:want])


def handshake(sock: socket.socket, host: str, target: str,
              headers: Optional[Mapping[str, str]] = None, timeout: float = 30.0,
              key: Optional[str] = None) -> WebSocket:
    """Upgrades a connected socket: sends GET `target` with the WebSocket headers (plus
    `headers`), checks the 101 answer and its Sec-WebSocket-Accept, and returns the WebSocket.
    HandshakeRefused for another status; WebSocketError for a 101 that is not right. The socket
    is closed on failure."""
    key = key or base64.b64encode(os.urandom(16)).decode("ascii")
    lines: List[str] = [
        f"GET {target} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    for name, value in (headers or {}).items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    deadline = time.monotonic() + timeout
    try:
        sock.settimeout(timeout)
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head, rest = _read_head(sock, deadline)
        status_line, _, header_block = head.decode("latin-1").partition("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise WebSocketError(f"not an HTTP response: {status_line[:80]!r}")
        status = int(parts[1])
        got: Dict[str, str] = {}
        for line in header_block.split("\r\n"):
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise WebSocketError(f"a malformed header line in the upgrade response: {line!r}")
            name = name.strip().lower()
            value = value.strip()
            got[name] = f"{got[name]}, {value}" if name in got else value
        if status != 101:
            raise HandshakeRefused(status, got, _read_refusal_body(sock, got, rest, deadline))
        if got.get("upgrade", "").lower() != "websocket":
            raise WebSocketError("the 101 answer does not say Upgrade: websocket")
        if "upgrade" not in [t.strip().lower() for t in got.get("connection", "").split(",")]:
            raise WebSocketError("the 101 answer does not say Connection: Upgrade")
        if got.get("sec-websocket-accept") != accept_key(key):
            raise WebSocketError("the server's Sec-WebSocket-Accept does not match the key sent")
        if got.get("sec-websocket-extensions"):
            raise WebSocketError("the server agreed to an extension that was not offered")
        sock.settimeout(timeout)  # bounds a send that blocks; recv waits with select
        return WebSocket(sock, rest)
    except BaseException:
        sock.close()
        raise

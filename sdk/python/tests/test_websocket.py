"""The SDK's WebSocket client (RFC 6455) and Terminal against a fake server on a socketpair or a
local listener: handshake, masking, the three length encodings, fragmentation, control frames in
the middle of a message, the closing handshake, protocol violations, and the event stream."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from airlock import AirlockError, AuthError, Client, InvalidRequest, ServerError, Timeout
from airlock import _websocket as ws
from airlock.processes import Terminal


class FakeServer:
    """The server end of a socketpair: answers the handshake, then sends and reads frames."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(10)
        self.buf = bytearray()
        self.request_head = ""
        self.headers: Dict[str, str] = {}

    def _read_more(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise EOFError("the client closed the connection")
        self.buf += data

    def accept(self, accept: Optional[str] = None, extra: bytes = b"") -> None:
        """Reads the upgrade request and answers 101 (with `accept`, else the right one);
        `extra` goes in the same write, right after the head."""
        while b"\r\n\r\n" not in self.buf:
            self._read_more()
        end = self.buf.index(b"\r\n\r\n")
        head = self.buf[:end].decode("latin-1")
        del self.buf[:end + 4]
        self.request_head = head
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        key = self.headers["sec-websocket-key"]
        answer = (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept or ws.accept_key(key)}\r\n\r\n"
        ).encode("latin-1")
        self.sock.sendall(answer + extra)

    def send(self, opcode: int, payload: bytes, fin: bool = True) -> None:
        self.sock.sendall(ws.encode_frame(opcode, payload, fin=fin))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> Tuple[bool, int, bytes, int]:
        """(fin, opcode, unmasked payload, the 7-bit length field) of the client's next frame;
        the frame must be masked."""
        while True:
            frame = ws.parse_frame(self.buf, expect_masked=True)
            if frame is not None:
                break
            self._read_more()
        fin, opcode, payload, size = frame
        length_field = self.buf[1] & 0x7F
        assert self.buf[1] & 0x80, "client frames must be masked"
        del self.buf[:size]
        return fin, opcode, payload, length_field


@pytest.fixture
def pair() -> Iterator[Tuple[socket.socket, FakeServer]]:
    client_end, server_end = socket.socketpair()
    server = FakeServer(server_end)
    try:
        yield client_end, server
    finally:
        client_end.close()
        server_end.close()


def run_server(script: Callable[[], None]) -> Tuple[threading.Thread, List[BaseException]]:
    """Runs the server's side in a thread; its exceptions are collected for the test."""
    errors: List[BaseException] = []

    def target() -> None:
        try:
            script()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


def join(thread: threading.Thread, errors: List[BaseException]) -> None:
    thread.join(10)
    assert not thread.is_alive(), "the fake server did not finish"
    if errors:
        raise errors[0]


def connect(client_end: socket.socket, headers: Optional[Dict[str, str]] = None) -> ws.WebSocket:
    return ws.handshake(client_end, "sandbox.test:7878", "/v1/x/ws", headers or {}, timeout=10)


def test_accept_key_matches_rfc_example() -> None:
    # RFC 6455, section 1.3.
    assert ws.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_masking_round_trips_and_changes_the_bytes() -> None:
    data = os.urandom(1001)
    mask = b"\x01\x02\x03\x04"
    masked = ws.mask_bytes(data, mask)
    assert masked != data and ws.mask_bytes(masked, mask) == data
    assert ws.mask_bytes(b"", mask) == b""
    assert ws.mask_bytes(b"\x00\x00\x00\x00\x00", mask) == b"\x01\x02\x03\x04\x01"


def test_handshake_request_and_leftover_bytes_after_the_head(pair) -> None:
    client_end, server = pair
    # The first frame arrives in the same segment as the 101 answer: it must not be lost.
    first = ws.encode_frame(ws.OP_TEXT, b'{"type":"start","pid":7}')
    thread, errors = run_server(lambda: server.accept(extra=first))
    conn = connect(client_end, {"Authorization": "Bearer secret"})
    join(thread, errors)
    assert server.request_head.startswith("GET /v1/x/ws HTTP/1.1\r\n")
    h = server.headers
    assert h["host"] == "sandbox.test:7878"
    assert h["upgrade"].lower() == "websocket" and h["connection"].lower() == "upgrade"
    assert h["sec-websocket-version"] == "13"
    assert len(base64.b64decode(h["sec-websocket-key"], validate=True)) == 16
    assert h["authorization"] == "Bearer secret"
    assert conn.recv(5) == (ws.OP_TEXT, b'{"type":"start","pid":7}')


def test_handshake_refuses_a_wrong_accept(pair) -> None:
    client_end, server = pair
    thread, errors = run_server(lambda: server.accept(accept=ws.accept_key("not the key")))
    with pytest.raises(ws.WebSocketError, match="Sec-WebSocket-Accept"):
        connect(client_end)
    join(thread, errors)
    assert client_end.fileno() == -1  # closed on failure


def test_handshake_refusal_carries_status_and_body(pair) -> None:
    client_end, server = pair
    body = b'{"error":{"code":"unauthenticated","message":"missing or invalid API key"}}'

    def script() -> None:
        while b"\r\n\r\n" not in server.buf:
            server._read_more()
        server.send_raw(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    thread, errors = run_server(script)
    with pytest.raises(ws.HandshakeRefused) as e:
        connect(client_end)
    join(thread, errors)
    assert e.value.status == 401 and e.value.body == body
    assert e.value.headers["content-type"] == "application/json"


def test_fragmented_messages_with_a_ping_in_the_middle(pair) -> None:
    client_end, server = pair
    pongs: List[Tuple[bool, int, bytes, int]] = []

    def script() -> None:
        server.accept()
        server.send(ws.OP_TEXT, b"hel", fin=False)
        server.send(ws.OP_PING, b"p-1")
        server.send(ws.OP_CONTINUATION, b"lo ", fin=False)
        server.send(ws.OP_PONG, b"unsolicited")  # ignored
        server.send(ws.OP_CONTINUATION, "w\u00f6rld".encode(), fin=True)
        # A binary message in three fragments, one of them empty, and a ping with no payload.
        server.send(ws.OP_BINARY, b"\x00\xff", fin=False)
        server.send(ws.OP_CONTINUATION, b"", fin=False)
        server.send(ws.OP_PING, b"")
        server.send(ws.OP_CONTINUATION, b"\x80", fin=True)
        pongs.append(server.read_frame())
        pongs.append(server.read_frame())

    thread, errors = run_server(script)
    conn = connect(client_end)
    assert conn.recv(5) == (ws.OP_TEXT, "hello w\u00f6rld".encode())
    assert conn.recv(5) == (ws.OP_BINARY, b"\x00\xff\x80")
    join(thread, errors)
    assert [(fin, op, payload) for fin, op, payload, _ in pongs] == [
        (True, ws.OP_PONG, b"p-1"), (True, ws.OP_PONG, b"")]


@pytest.mark.parametrize("size,length_field", [
    (0, 0), (125, 125), (126, 126), (127, 126), (65535, 126), (65536, 127), (200000, 127)])
def test_payload_lengths_both_ways(pair, size: int, length_field: int) -> None:
    client_end, server = pair
    payload = os.urandom(size)
    echoed: List[Tuple[bool, int, bytes, int]] = []

    def script() -> None:
        server.accept()
        server.send(ws.OP_BINARY, payload)
        echoed.append(server.read_frame())

    thread, errors = run_server(script)
    conn = connect(client_end)
    assert conn.recv(10) == (ws.OP_BINARY, payload)
    conn.send_binary(payload)
    join(thread, errors)
    fin, opcode, got, field = echoed[0]
    assert (fin, opcode, got == payload, field) == (True, ws.OP_BINARY, True, length_field)


def test_each_client_frame_has_a_fresh_mask(pair) -> None:
    client_end, server = pair
    raws: List[bytes] = []

    def script() -> None:
        server.accept()
        for _ in range(2):
            while len(server.buf) < 2 + 4 + 8:
                server._read_more()
            raws.append(bytes(server.buf[:2 + 4 + 8]))
            del server.buf[:2 + 4 + 8]

    thread, errors = run_server(script)
    conn = connect(client_end)
    conn.send_binary(b"\x00" * 8)
    conn.send_binary(b"\x00" * 8)
    join(thread, errors)
    masks = [r[2:6] for r in raws]
    # Zero bytes masked are the mask itself: the payload on the wire is not the plain text.
    assert [r[6:14] for r in raws] == [m * 2 for m in masks]
    assert masks[0] != masks[1]


def test_a_frame_split_across_a_timeout_is_not_lost(pair) -> None:
    client_end, server = pair
    frame = ws.encode_frame(ws.OP_TEXT, b"x" * 300)
    sent_half = threading.Event()
    go_on = threading.Event()

    def script() -> None:
        server.accept()
        server.send_raw(frame[:3])  # inside the extended length
        sent_half.set()
        go_on.wait(10)
        server.send_raw(frame[3:])

    thread, errors = run_server(script)
    conn = connect(client_end)
    assert sent_half.wait(10)
    with pytest.raises(socket.timeout):
        conn.recv(0.2)
    go_on.set()
    assert conn.recv(10) == (ws.OP_TEXT, b"x" * 300)
    join(thread, errors)


def test_server_initiated_close_is_echoed(pair) -> None:
    client_end, server = pair
    echoed: List[Tuple[bool, int, bytes, int]] = []

    def script() -> None:
        server.accept()
        server.send(ws.OP_TEXT, b"last")
        server.send(ws.OP_CLOSE, struct.pack("!H", 1000) + b"bye")
        echoed.append(server.read_frame())

    thread, errors = run_server(script)
    conn = connect(client_end)
    assert conn.recv(5) == (ws.OP_TEXT, b"last")
    assert conn.recv(5) is None
    join(thread, errors)
    assert (conn.close_code, conn.close_reason, conn.closed) == (1000, "bye", True)
    assert echoed[0][:3] == (True, ws.OP_CLOSE, struct.pack("!H", 1000))
    with pytest.raises(ws.WebSocketError):
        conn.send_text("too late")
    conn.close()  # finishes: closes the socket without another close frame
    assert client_end.fileno() == -1


def test_client_initiated_close_waits_for_the_answer(pair) -> None:
    client_end, server = pair
    got: List[Tuple[bool, int, bytes, int]] = []

    def script() -> None:
        server.accept()
        server.send(ws.OP_BINARY, b"in flight")  # arrives after the client's close: discarded
        got.append(server.read_frame())
        server.send(ws.OP_CLOSE, got[0][2])
        server.sock.shutdown(socket.SHUT_WR)

    thread, errors = run_server(script)
    conn = connect(client_end)
    conn.close(1000, "done")
    join(thread, errors)
    assert got[0][:3] == (True, ws.OP_CLOSE, struct.pack("!H", 1000) + b"done")
    assert conn.close_code == 1000
    assert client_end.fileno() == -1
    conn.close()  # idempotent


@pytest.mark.parametrize("bad,code", [
    (bytes([0x82, 0x81]) + b"\x00\x00\x00\x00" + b"a", ws.CLOSE_PROTOCOL_ERROR),  # masked
    (bytes([0x80, 0x01]) + b"a", ws.CLOSE_PROTOCOL_ERROR),  # continuation of nothing
    (bytes([0xC2, 0x01]) + b"a", ws.CLOSE_PROTOCOL_ERROR),  # RSV1 without an extension
    (bytes([0x89, 0x7E, 0x00, 0x7E]) + b"p" * 126, ws.CLOSE_PROTOCOL_ERROR),  # long ping
    (bytes([0x09, 0x01]) + b"p", ws.CLOSE_PROTOCOL_ERROR),  # fragmented ping
    (bytes([0x83, 0x00]), ws.CLOSE_PROTOCOL_ERROR),  # reserved opcode
    (bytes([0x81, 0x02]) + b"\xc3\x28", ws.CLOSE_INVALID_DATA),  # text that is not UTF-8
    (bytes([0x01, 0x01]) + b"a" + bytes([0x81, 0x01]) + b"b", ws.CLOSE_PROTOCOL_ERROR),
    (bytes([0x82, 0x7F]) + struct.pack("!Q", 1 << 63) + b"", ws.CLOSE_PROTOCOL_ERROR),
    (bytes([0x82, 0x7F]) + struct.pack("!Q", ws.MAX_MESSAGE_BYTES + 1), ws.CLOSE_TOO_BIG),
])
def test_protocol_violations_fail_the_connection(pair, bad: bytes, code: int) -> None:
    client_end, server = pair
    got: List[Tuple[bool, int, bytes, int]] = []

    def script() -> None:
        server.accept()
        server.send_raw(bad)
        got.append(server.read_frame())

    thread, errors = run_server(script)
    conn = connect(client_end)
    with pytest.raises(ws.WebSocketError) as e:
        conn.recv(5)
    join(thread, errors)
    assert e.value.code == code
    assert got[0][:3] == (True, ws.OP_CLOSE, struct.pack("!H", code))
    assert client_end.fileno() == -1


def test_connection_dropped_without_close_frame(pair) -> None:
    client_end, server = pair

    def script() -> None:
        server.accept()
        server.send(ws.OP_TEXT, b"a")
        server.sock.shutdown(socket.SHUT_RDWR)

    thread, errors = run_server(script)
    conn = connect(client_end)
    join(thread, errors)
    assert conn.recv(5) == (ws.OP_TEXT, b"a")
    assert conn.recv(5) is None
    assert conn.close_code == 1006


# --- Client.websocket over TCP: the key, the Host header, refusals mapped to SDK errors ---


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    s.settimeout(10)
    try:
        yield s
    finally:
        s.close()


def _serve_once(listener: socket.socket, answer: Optional[bytes]) -> Tuple[threading.Thread,
                                                                            List[BaseException],
                                                                            List[FakeServer]]:
    servers: List[FakeServer] = []

    def script() -> None:
        conn, _ = listener.accept()
        server = FakeServer(conn)
        servers.append(server)
        if answer is None:
            server.accept()
            server.send(ws.OP_CLOSE, struct.pack("!H", 1000))
            server.read_frame()
        else:
            while b"\r\n\r\n" not in server.buf:
                server._read_more()
            server.send_raw(answer)
        conn.close()

    thread, errors = run_server(script)
    return thread, errors, servers


def test_client_websocket_sends_the_key_and_maps_refusals(listener) -> None:
    port = listener.getsockname()[1]
    client = Client(url=f"http://127.0.0.1:{port}/prefix", api_key="the-key", timeout=10)
    thread, errors, servers = _serve_once(listener, None)
    conn = client.websocket("/v1/sandboxes/sbx-1/exec/ws", query=[("replay", "true")])
    assert conn.recv(5) is None
    join(thread, errors)
    head = servers[0].request_head
    assert head.startswith("GET /prefix/v1/sandboxes/sbx-1/exec/ws?replay=true HTTP/1.1\r\n")
    assert servers[0].headers["authorization"] == "Bearer the-key"
    assert servers[0].headers["host"] == f"127.0.0.1:{port}"
    conn.close()

    for status, code, exc in ((401, "unauthenticated", AuthError),
                              (400, "invalid_argument", InvalidRequest),
                              (503, "unavailable", ServerError)):
        body = json.dumps({"error": {"code": code, "message": "nope"}}).encode()
        answer = (f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        thread, errors, _ = _serve_once(listener, answer)
        with pytest.raises(exc) as e:
            client.websocket("/v1/sandboxes/sbx-1/exec/ws")
        join(thread, errors)
        assert (e.value.status, e.value.code, e.value.message) == (status, code, "nope")


def test_client_websocket_unreachable_is_server_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerError, match="cannot reach airlockd"):
        Client(url=f"http://127.0.0.1:{port}", api_key="k", timeout=5).websocket("/x")


# --- Terminal: the event stream over a fake server ---


def _event(kind: str, **fields: object) -> bytes:
    return json.dumps(dict(type=kind, time="2026-11-29T16:00:00.000Z", **fields)).encode()


def test_terminal_events_input_and_exit(pair) -> None:
    client_end, server = pair
    received: List[Tuple[bool, int, bytes, int]] = []
    ready = threading.Event()

    def script() -> None:
        server.accept()
        received.append(server.read_frame())  # the exec request
        server.send(ws.OP_TEXT, _event("start", pid=42))
        server.send(ws.OP_TEXT, _event("stdout", data="$ ", data_encoding="utf-8"))
        for _ in range(4):
            received.append(server.read_frame())
        ready.set()
        server.send(ws.OP_TEXT, _event(
            "stdout", data=base64.b64encode(b"\xff\xfe 42\r\n$ ").decode(),
            data_encoding="base64"))
        server.send(ws.OP_TEXT, _event("dropped", bytes=10))
        server.send(ws.OP_TEXT, _event("stderr", data="err"))
        server.send(ws.OP_TEXT, _event("exit", exit_code=4, signal=None, duration_ms=12,
                                       timed_out=False, oom_killed=False))
        server.send(ws.OP_CLOSE, struct.pack("!H", 1000))
        received.append(server.read_frame())

    thread, errors = run_server(script)
    t = Terminal(connect(client_end))
    t._send_json({"cmd": "bash", "pty": {"cols": 80, "rows": 24}})
    assert t.read_until("$ ", timeout=5) == b"$ "
    assert t.pid == 42
    t.send("echo $((6*7))\n")
    t.resize(100, 30)
    t.signal("INT")
    t.close_stdin()
    assert ready.wait(10)
    assert t.read_until(b"42", timeout=5) == b"\xff\xfe 42"
    status = t.wait(5)
    assert (status.exit_code, status.signal, status.duration_ms, status.ok) == (4, None, 12, False)
    assert t.recv(1) == b"\r\n$ err"  # what wait() read past stays for recv()
    assert t.recv(1) == b""
    with pytest.raises(AirlockError, match="ended before"):
        t.read_until("more", timeout=1)
    assert t.dropped == 10 and t.ended
    t.close()
    join(thread, errors)
    kinds = [(op, payload) for _, op, payload, _ in received]
    assert json.loads(kinds[0][1]) == {"cmd": "bash", "pty": {"cols": 80, "rows": 24}}
    assert kinds[1] == (ws.OP_BINARY, b"echo $((6*7))\n")
    assert [json.loads(p) for _, p in kinds[2:5]] == [
        {"type": "resize", "cols": 100, "rows": 30}, {"type": "signal", "signal": "INT"},
        {"type": "stdin_close"}]
    assert kinds[5][0] == ws.OP_CLOSE


def test_terminal_error_event_and_timeouts(pair) -> None:
    client_end, server = pair
    go = threading.Event()

    def script() -> None:
        server.accept()
        server.send(ws.OP_TEXT, _event("stdout", data="partial"))
        go.wait(10)
        server.send(ws.OP_TEXT, _event(
            "error", error={"code": "invalid_argument", "message": "no such program"}))
        server.send(ws.OP_CLOSE, struct.pack("!H", 1000))
        server.read_frame()

    thread, errors = run_server(script)
    t = Terminal(connect(client_end))
    with pytest.raises(Timeout, match="did not appear"):
        t.read_until("never", timeout=0.3)
    with pytest.raises(Timeout):
        t.wait(0.2)
    assert t.recv(1) == b"partial"  # kept across both timeouts
    go.set()
    with pytest.raises(InvalidRequest, match="no such program"):
        t.wait(5)
    with pytest.raises(InvalidRequest):
        t.recv(1)
    t.close()
    join(thread, errors)


def test_terminal_connection_lost_before_exit(pair) -> None:
    client_end, server = pair

    def script() -> None:
        server.accept()
        server.send(ws.OP_TEXT, _event("stdout", data="abc"))
        server.sock.shutdown(socket.SHUT_RDWR)

    thread, errors = run_server(script)
    t = Terminal(connect(client_end))
    with pytest.raises(ServerError, match="closed .*before the command's exit"):
        t.read_until("xyz", timeout=5)
    join(thread, errors)
    assert t.recv(1) == b"abc"
    with pytest.raises(ServerError, match="closed .*before the command's exit"):
        t.wait(1)
    t.close()


def test_terminal_takes_a_message_of_several_ndjson_lines(pair) -> None:
    # The contract sends one event per message; a message holding several NDJSON lines (as an
    # HTTP chunk of the output stream does) is read line by line rather than refused.
    client_end, server = pair

    def script() -> None:
        server.accept()
        server.send(ws.OP_TEXT, _event("stdout", data="a\r\n") + b"\n" +
                    _event("exit", exit_code=0, signal=None) + b"\n")
        server.send(ws.OP_CLOSE, struct.pack("!H", 1000))
        server.read_frame()

    thread, errors = run_server(script)
    t = Terminal(connect(client_end))
    assert t.wait(5).exit_code == 0
    assert t.recv(1) == b"a\r\n" and t.recv(1) == b""
    t.close()
    join(thread, errors)

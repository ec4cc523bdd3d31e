"""A TCP relay a test can blackhole, as a network that drops packets silently: nothing is reset or
closed, nothing arrives, and the clients on either side learn of the fault only from their own
timeouts. Like TCP across a real partition, nothing is lost either: what was sent meanwhile waits
in the relay's socket buffers and flows once the partition heals (if its sender still waits)."""

from __future__ import annotations

import selectors
import socket
import threading


class BlackholeRelay:
    """Listens on 127.0.0.1 (port chosen on creation) and relays each connection to `target_port`,
    set with `connect_to` before the first client arrives. While blackholed it neither reads nor
    accepts: a new connection completes its handshake in the kernel and then hears nothing."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.target_port = 0
        self._open = threading.Event()
        self._open.set()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="blackhole-relay", daemon=True)
        self._thread.start()

    def connect_to(self, target_port: int) -> None:
        """Where connections go."""
        self.target_port = target_port

    def blackhole(self) -> None:
        """From now on nothing passes, either way, on open and new connections."""
        self._open.clear()

    def heal(self) -> None:
        """Relay again, what waited first."""
        self._open.set()

    def close(self) -> None:
        """Stop relaying and close every socket."""
        self._stop.set()
        self._open.set()
        self._thread.join(timeout=5)
        for sock in [self._listener, *self._peers]:
            sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._open.wait(0.1):
                continue  # blackholed: bytes and connections wait in the kernel
            for key, _ in self._selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                elif sock in self._peers:
                    self._relay(sock)
                if not self._open.is_set():
                    break

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            client.close()
            return
        self._peers[client], self._peers[upstream] = upstream, client
        for sock in (client, upstream):
            self._selector.register(sock, selectors.EVENT_READ)

    def _relay(self, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        for end in (sock, peer):  # closed (or reset) by one side: close the other
            if end in self._peers:
                self._selector.unregister(end)
                del self._peers[end]
                end.close()

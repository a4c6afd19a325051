"""A TCP proxy the tests can freeze: a server that hangs as a frozen VM or a stopped process looks to its
clients (connections stay open, the kernel acknowledges what is sent, nothing comes back), without
freezing a server other tests share."""

from __future__ import annotations

import select
import socket
import threading


class FreezableProxy:
    """Forwards 127.0.0.1:`port` to `target` (host, port), one thread for all connections. `freeze()`
    stops forwarding in both directions, new connections included (they are accepted by the kernel and
    then hear nothing, like a stopped postmaster's); `thaw()` forwards again what waited."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.pairs: dict[socket.socket, socket.socket] = {}
        self.thawed = threading.Event()
        self.thawed.set()
        self.running = True
        self.thread = threading.Thread(target=self._run, name="freezable-proxy", daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        self.thawed.clear()

    def thaw(self) -> None:
        self.thawed.set()

    def _run(self) -> None:
        while self.running:
            if not self.thawed.wait(0.05):
                continue
            readable, _, _ = select.select([self.listener, *self.pairs], [], [], 0.05)
            for sock in readable:
                if not self.thawed.is_set():
                    break
                if sock is self.listener:
                    self._accept()
                else:
                    self._pump(sock)

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        self.pairs[client], self.pairs[upstream] = upstream, client

    def _pump(self, sock: socket.socket) -> None:
        other = self.pairs.get(sock)
        if other is None:  # closed with its pair, earlier in the same round of select
            return
        try:
            data = sock.recv(65536)
            if data:
                other.sendall(data)
                return
        except OSError:
            pass
        for s in (sock, other):
            self.pairs.pop(s, None)
            s.close()

    def close(self) -> None:
        self.running = False
        self.thread.join(2)
        for sock in list(self.pairs):
            sock.close()
        self.listener.close()

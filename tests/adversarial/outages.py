"""Real database outages for one test, on either backend, touching nothing
but that test's own database.

- PostgreSQL: the test's connections go through ``Proxy``, a TCP relay on
  localhost. ``down()`` drops every relayed connection and refuses new ones
  (closing each as it arrives), as a server that went away would look to
  the client; ``up()`` relays again. The real server stays up for everyone
  else on it.
- SQLite: ``down()`` starts another process that holds the file's write
  lock (``BEGIN EXCLUSIVE``) until ``up()``; writers wait ``busy_timeout``
  and fail with "database is locked".
"""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import sys
import threading
from types import TracebackType

from sqlalchemy.engine import make_url


class Proxy:
    """A TCP relay from 127.0.0.1:<port> to ``target``, with a switch."""

    def __init__(self, target_host: str, target_port: int, listen: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen = listen
        """The address it listens on (another network namespace reaches it over a veth pair)."""
        self._listener = socket.create_server((listen, 0))
        self.port = int(self._listener.getsockname()[1])
        self._down = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._servers: dict[socket.socket, socket.socket] = {}
        """Each relayed client socket's server side."""
        self._forgotten: set[socket.socket] = set()
        """Client sockets of flows ``forget_flows`` dropped: silent until written to."""
        self._closed = False
        threading.Thread(target=self._accept, name="test-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._down.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets.update((client, server))
                self._servers[client] = server
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                if s not in self._forgotten:
                    self._forget(s)
                elif s is src:  # the client wrote into a forgotten flow: a reset, as a middlebox answers
                    with contextlib.suppress(OSError):  # closed meanwhile (the proxy's close)
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self._forgotten.discard(s)
                    self._forget(s)

    def forget_flows(self) -> None:
        """What a NAT or firewall that dropped its state, or a rebooted host,
        looks like to the client: each relayed connection stays open on the
        client's side and says nothing, until the client writes into it and
        gets a reset. (The server side is closed, so the real backend ends.)"""
        with self._lock:
            pairs = list(self._servers.items())
            self._forgotten.update(client for client, _ in pairs)
        for _, server in pairs:
            self._forget(server)

    def _forget(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(s)
            self._servers.pop(s, None)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()

    def down(self) -> None:
        self._down.set()
        with self._lock:
            live = list(self._sockets)
        for s in live:
            self._forget(s)

    def up(self) -> None:
        self._down.clear()

    def close(self) -> None:
        self.down()
        self._listener.close()

    def url(self, url: str) -> str:
        """``url`` (a PostgreSQL URL) pointed at this relay."""
        return make_url(url).set(host=self.listen, port=self.port).render_as_string(hide_password=False)


_LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


class SqliteLock:
    """Another process holding a SQLite file's write lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._proc: subprocess.Popen[str] | None = None

    def down(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LOCKER, self.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the lock is held (or the locker died)
        assert line.strip() == "locked", f"the locking process failed: {line!r}"
        self._proc = proc

    def up(self) -> None:
        """Let the lock go (the holder rolls back and exits)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdin.close()
            proc.stdout.close()

    def close(self) -> None:
        self.up()


class Outage:
    """One test's database and a switch that makes it unreachable (or locked)."""

    def __init__(self, backend: str, db_url: str) -> None:
        self.backend = backend
        self._switch: Proxy | SqliteLock
        if backend == "postgres":
            parsed = make_url(db_url)
            self._switch = Proxy(parsed.host or "127.0.0.1", parsed.port or 5432)
            self.url = self._switch.url(db_url)
        else:
            path = make_url(db_url).database
            assert path
            self._switch = SqliteLock(path)
            self.url = db_url

    def down(self) -> None:
        self._switch.down()

    def up(self) -> None:
        self._switch.up()

    def close(self) -> None:
        self._switch.close()

    def __enter__(self) -> Outage:
        self.down()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.up()

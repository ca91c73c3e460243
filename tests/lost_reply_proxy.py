"""A TCP proxy that can lose the server's reply to a COMMIT (the commit happens, the client never hears of it),
and counts the round trips its clients make.

The "ambiguous commit" fault: the client's connection dies mid-COMMIT and it cannot tell whether the transaction
was applied. Everything else is forwarded byte for byte (no TLS: the proxy must see the COMMIT)."""

from __future__ import annotations

import asyncio
import re

# COMMIT, or PostgreSQL's one-round-trip commit (a call that is its own transaction).
_COMMIT = re.compile(rb"\bCOMMIT\b|\bagent_store_commit\(", re.IGNORECASE)
_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"  # the server's "done with your last request" message
_PRE_STARTUP = (80877103, 80877104)  # SSLRequest, GSSENCRequest: another untyped startup message follows


class _CommitSpotter:
    """Splits the client->server stream into messages; feed() is true when a COMMIT is about to run: a Query saying
    COMMIT, or a Bind of a statement Parsed from such SQL. Only SQL text counts, never bound parameter values."""

    def __init__(self) -> None:
        self.requests = 0  # Sync and Query messages: each is answered by ReadyForQuery, i.e. one round trip
        self.buf = bytearray()
        self.untyped = True  # the first messages (SSLRequest, startup) have no type byte
        self.commit_statements: set[bytes] = set()  # names of prepared statements whose SQL is a COMMIT

    def feed(self, chunk: bytes) -> bool:
        self.buf += chunk
        found = False
        while len(self.buf) >= (head := 0 if self.untyped else 1) + 4:
            end = head + int.from_bytes(self.buf[head : head + 4], "big")
            if len(self.buf) < end:
                break  # the rest of this message comes in a later chunk
            kind, body = bytes(self.buf[:head]), bytes(self.buf[head + 4 : end])
            del self.buf[:end]
            fields = body.split(b"\0")
            if self.untyped:
                self.untyped = int.from_bytes(body[:4], "big") in _PRE_STARTUP
            elif kind == b"Q":  # Query: sql
                self.requests += 1
                found |= bool(_COMMIT.search(fields[0]))
            elif kind == b"S":  # Sync: the end of one extended-protocol request
                self.requests += 1
            elif kind == b"P":  # Parse: statement name, sql, ...
                (self.commit_statements.add if _COMMIT.search(fields[1]) else self.commit_statements.discard)(fields[0])
            elif kind == b"B":  # Bind: portal name, statement name, ...
                found |= fields[1] in self.commit_statements
        return found


class LostReplyProxy:
    """``port = await proxy.start()``; connect to 127.0.0.1:port; ``proxy.drop_reply_after_commit()``; ..."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host, self.target_port = target_host, target_port
        self.port = 0
        self.armed = False
        self.cut_at_once = False  # with armed: cut the client as soon as the COMMIT is forwarded
        self.drops = 0  # how many COMMIT replies were swallowed so far
        self._spotters: list[_CommitSpotter] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # one _handle per proxied connection

    def drop_reply_after_commit(self) -> None:
        """Arm: the next COMMIT a client sends goes through, its reply does not. One shot."""
        self.armed = True

    def cut_client_at_commit(self) -> None:
        """Arm: the next COMMIT a client sends goes through and the client is cut at once, while the server still
        works on it (it finishes, and its reply is swallowed). One shot. The client's retry can then reach the
        server before the first attempt has ended there."""
        self.armed, self.cut_at_once = True, True

    @property
    def round_trips(self) -> int:
        """Requests the clients made so far, over every connection (each waits for the server's ReadyForQuery)."""
        return sum(s.requests for s in self._spotters)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and cut every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in self._tasks:
            task.cancel()  # _handle swallows the cancellation and closes both of its sockets
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        writers = [c_writer]
        doomed = asyncio.Event()  # set once this connection has sent the COMMIT whose reply we will drop
        spotter = _CommitSpotter()
        self._spotters.append(spotter)
        pumps: list[asyncio.Future[None]] = []
        try:
            s_reader, s_writer = await asyncio.wait_for(asyncio.open_connection(self.target_host, self.target_port), 10)
            writers.append(s_writer)

            async def client_to_server() -> None:
                while chunk := await c_reader.read(65536):
                    if spotter.feed(chunk) and self.armed:
                        self.armed = False  # disarm now: exactly one connection, one COMMIT
                        doomed.set()  # before the write, so no reply byte can slip past
                    s_writer.write(chunk)
                    await s_writer.drain()
                    if doomed.is_set() and self.cut_at_once:
                        self.cut_at_once = False
                        c_writer.transport.abort()  # the client hears nothing more; the server goes on
                        await asyncio.Event().wait()  # read no more from the client; server_to_client ends it

            async def server_to_client() -> None:
                swallowed = b""
                while chunk := await s_reader.read(65536):
                    if not doomed.is_set():
                        c_writer.write(chunk)
                        await c_writer.drain()
                        continue
                    swallowed += chunk  # swallow the answer until ReadyForQuery: the COMMIT is then done
                    if _READY_FOR_QUERY in swallowed:
                        self.drops += 1
                        return  # and hang up on both sides

            pumps += [asyncio.ensure_future(client_to_server()), asyncio.ensure_future(server_to_client())]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)  # EOF, reset or drop: end both ways
        except (TimeoutError, OSError, asyncio.CancelledError):
            pass  # target down, peer reset, or stop(). No re-raise: asyncio would log the handler's exception.
        finally:
            for w in writers:
                w.transport.abort()  # immediate close, no waiting on a peer that may be gone
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.discard(task)

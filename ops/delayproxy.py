"""A TCP proxy that can hold back the server's bytes: a slow model server over real sockets.

Each chunk from the upstream is forwarded ``delay_s`` after it arrived (order kept, delays do not
add up), so a request sees about ``delay_s`` of extra latency whatever else is in flight.
``delay_s`` can change while connections are open; setting it to 0 releases held bytes.
Runs its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class DelayProxy:
    """Listen on 127.0.0.1:<port> and pipe to ``upstream_host:upstream_port``.

    ``port`` 0 (default) picks a free port; ``start()`` sets ``self.port`` to the one it listens on.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", port: int = 0):
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = 0.0
        self.port = port
        # Bytes piped each way (client -> upstream, upstream -> client): wire bytes incl. framing.
        self.bytes_up = 0
        self.bytes_down = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> DelayProxy:
        """Start listening on a free port; return self."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("delay proxy did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every connection."""
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()  # like a dead server: the connection is refused/closed at once
            return
        await asyncio.gather(
            self._pipe(reader, up_writer, delayed=False),
            self._pipe(up_reader, writer, delayed=True),
            return_exceptions=True,
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                arrived, data = await queue.get()
                if not data:
                    break
                # The delay is read again while waiting: removing it releases held bytes at once.
                while delayed and (wait := arrived + self.delay_s - time.monotonic()) > 0:
                    await asyncio.sleep(min(wait, 0.05))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                if delayed:
                    self.bytes_down += len(data)
                else:
                    self.bytes_up += len(data)
                await queue.put((time.monotonic(), data))
        finally:
            await queue.put((0.0, b""))
            with contextlib.suppress(Exception):
                await sender
            writer.close()

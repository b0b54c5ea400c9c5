#!/usr/bin/env python3
"""A TCP proxy that delays every byte by a fixed one-way time in each direction.

`deno task bench --rtt MS` puts it between every system and PostgreSQL, so the database is a
round trip of MS away, as on a network (a client and its database on different hosts). The
kernel's netem qdisc would be the usual tool, but machines without the sch_netem module (as
ours) cannot load it; and JavaScript timers here are quantised to whole milliseconds (often
2 ms under load), too coarse for a 0.5 ms one-way delay. Python's event loop sleeps with
microsecond precision.

    python3 delay_proxy.py TARGET_HOST TARGET_PORT ONE_WAY_MS

Listens on 127.0.0.1 at a free port and prints "PORT <n>" on stdout once ready. Order is kept
per direction: each chunk is written at (arrival + delay), after every chunk before it. An end
of stream on one side is passed on after the data before it. Runs until killed.
"""

import asyncio
import collections
import socket
import sys


class DelayedPipe:
    """One direction of a connection: reads from `reader`, writes to `writer` `delay` later."""

    def __init__(self, loop, reader, writer, delay):
        self.loop = loop
        self.reader = reader
        self.writer = writer
        self.delay = delay
        self.pending = collections.deque()  # (due, bytes or None for end of stream)
        self.timer = None

    def push(self, data):
        self.pending.append((self.loop.time() + self.delay, data))
        if self.timer is None:
            self.timer = self.loop.call_at(self.pending[0][0], self.flush)

    def flush(self):
        self.timer = None
        now = self.loop.time()
        while self.pending and self.pending[0][0] <= now:
            _, data = self.pending.popleft()
            if self.writer.is_closing():
                self.pending.clear()
                return
            if data is None:
                try:
                    self.writer.write_eof()
                except OSError:
                    self.writer.close()
            else:
                self.writer.write(data)
        if self.pending:
            self.timer = self.loop.call_at(self.pending[0][0], self.flush)

    async def run(self):
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.push(data)
        except (ConnectionError, OSError):
            pass
        self.push(None)


async def main():
    host, port, one_way_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    delay = one_way_ms / 1000
    loop = asyncio.get_running_loop()

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        for w in (client_writer, server_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up = DelayedPipe(loop, client_reader, server_writer, delay)
        down = DelayedPipe(loop, server_reader, client_writer, delay)
        await asyncio.gather(up.run(), down.run())
        # Both ends have closed: let the last delayed writes go out, then close.
        await asyncio.sleep(delay * 2)
        for w in (client_writer, server_writer):
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass

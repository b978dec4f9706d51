"""hosts_store: the teardown's question 'does this process serve the world's store?' is answered from this
process's own sockets: True where the server runs, False for a client of a server in another process."""

from __future__ import annotations

import os

import torch.distributed as dist

from simulator.comm import hosts_store


def test_the_hosting_process_is_told_apart_from_a_client_process() -> None:
    read, write = os.pipe()  # child -> parent: its server's port, and whether it found itself hosting
    asked, ask = os.pipe()  # parent -> child: done, the server may go
    child = os.fork()  # before any server exists here, so this process inherits no listening socket
    if child == 0:
        try:
            server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
            os.write(write, f"{server.port} {int(hosts_store(server))}\n".encode())
            os.read(asked, 1)  # until the parent has asked
        finally:
            os._exit(0)
    try:
        port, child_says = map(int, os.read(read, 64).split())
        client = dist.TCPStore("127.0.0.1", port, 1, False)
        assert child_says == 1, "the process running the server must be found to host it"
        assert not hosts_store(client), "a client in another process must not be taken for the host"
        assert not hosts_store(dist.HashStore())
    finally:
        os.write(ask, b"x")
        os.waitpid(child, 0)
        for fd in (read, write, asked, ask):
            os.close(fd)

"""Loopback addresses for the tests that start TensorFlow cluster tasks in their own processes."""

import socket


def free_ports(n):
    """n distinct free loopback ports (all bound at once, so they differ; released just before use)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()

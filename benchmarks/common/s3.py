"""A local S3 server (moto's server mode on a loopback port) holding Parquet sources, and a proxy that
gives it an object store's latency: shared by the storage tests and the storage and start-up benchmarks."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3(data_dir: Path, names, bucket: str, access_key: str = "testing", **env):
    """A moto S3 server on a free port with bucket ``bucket`` holding ``data_dir/NAME/*.parquet`` for
    every source NAME of ``names`` at ``NAME/``; ``env`` goes to the server (e.g. moto's IAM switches).
    Yields (URI query string that reaches it, port, a pyarrow S3FileSystem on it)."""
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
    try:
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
                               access_key=access_key, secret_key=access_key, allow_bucket_creation=True)
        _create_bucket(fs, bucket, deadline=time.monotonic() + 30)
        for name in names:
            for path in sorted((Path(data_dir) / name).glob("*.parquet")):
                pafs.copy_files(str(path), f"{bucket}/{name}/{path.name}", destination_filesystem=fs)
        yield f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1", port, fs
    finally:
        server.terminate()
        server.wait(10)


def _create_bucket(fs: pafs.S3FileSystem, bucket: str, deadline: float) -> None:
    """Creates the bucket as soon as the server answers (it takes a moment to start)."""
    while True:
        try:
            fs.create_dir(bucket)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class LatencyProxy:
    """A loopback TCP proxy holding each chunk a client sends (an HTTP request) ``latency`` seconds."""

    def __init__(self, upstream: int, latency: float):
        self.upstream, self.latency = upstream, latency
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, self.latency), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, 0.0), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while chunk := src.recv(1 << 16):
                if delay:
                    time.sleep(delay)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()

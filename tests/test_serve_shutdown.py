"""SIGTERM / SIGINT with streams open: ``lucegen serve`` (a subprocess) stops accepting, cuts the open streams after
its shutdown timeout, closes the engine and exits without a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serve_helpers import free_port, write_tiny

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_with_streams_open(tiny, signum):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "lucegen.cli", "serve", str(tiny), "--device", "cpu", "--port",
                             str(port), "--slots", "2", "--max-context", "8192", "--shutdown-timeout", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        chunks = [0, 0, 0]
        ended = []

        def stream(i):
            try:
                with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
                        "model": tiny.name, "prompt": "a river", "max_tokens": 8000, "temperature": 0,
                        "stream": True}) as r:
                    for line in r.iter_lines():
                        chunks[i] += line.startswith("data: {")
            except httpx.TransportError:
                pass  # the server cut the stream
            ended.append(i)

        threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        while sorted(chunks)[1] < 3:  # two slots streaming, one request queued
            assert time.monotonic() < deadline + 20, chunks
            time.sleep(0.01)
        t0 = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        for t in threads:
            t.join(timeout=10)
        print(f"\n{signal.Signals(signum).name}: exited {proc.returncode} after {time.monotonic() - t0:.1f} s, "
              f"streams got {chunks} chunks")
        assert sorted(ended) == [0, 1, 2]
        assert "Traceback" not in err, err
        assert proc.returncode in (0, -signum, 128 + signum), (proc.returncode, err)
        assert max(chunks) < 8000  # cut, not run to the end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

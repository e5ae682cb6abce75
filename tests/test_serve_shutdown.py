"""SIGTERM / SIGINT with streams open: ``lucegen serve`` (a subprocess) stops accepting, cuts the open streams after
its shutdown timeout, closes the engine and exits without a traceback."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from serve_helpers import start_server_process, write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_with_streams_open(tiny, signum):
    proc, url = start_server_process(tiny, "--slots", "2", "--max-context", "8192", "--shutdown-timeout", "1")
    deadline = time.monotonic()
    try:
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
            assert time.monotonic() < deadline + 30, chunks
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

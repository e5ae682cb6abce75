"""What the serve tests share: a tiny checkpoint (init-weights' tiny preset), a real uvicorn server on 127.0.0.1
with a free port in a thread, started and stopped around a test module, and a scripted engine double for the
parser and protocol tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from lucegen.runtime.engine import Engine, Sequence

TEMPLATE = Path(__file__).parent / "data" / "serve_chat_template.jinja"
ROOT = Path(__file__).resolve().parents[1]


def write_tiny(out: Path) -> Path:
    from lucegen.model.config import PRESETS
    from lucegen.model.init_weights import write_hf_checkpoint

    write_hf_checkpoint(PRESETS["tiny"], out, seed=0, progress=False)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server_process(model: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """``python -m lucegen.cli serve MODEL --device cpu --port P ARGS`` from this checkout; returns (process, url)
    once /health answers."""
    port = free_port()
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "lucegen.cli", "serve", str(model), "--device", "cpu", "--port",
                             str(port), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"lucegen serve did not start: {proc.communicate()[1]}")
        time.sleep(0.1)


class ServerThread:
    """``ServerThread(llm, **options)``: lucegen's app for ``llm`` on uvicorn in a thread; ``url``; ``stop()``."""

    def __init__(self, llm, **options):
        from lucegen.serve.app import DrainingUvicorn, Server, ServeOptions

        options.setdefault("model_name", "tiny")
        self.server = Server(llm, ServeOptions(**options))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.uvicorn = DrainingUvicorn(self.server, "127.0.0.1", self.port)
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kw)

    def stop(self) -> None:
        self.uvicorn.handle_exit(None, None)
        self.thread.join(timeout=30)


class ScriptedSequence(Sequence):
    """Replays ``engine.script`` (token ids) whatever the prompt: the first token from prefill, the rest from
    decode, one per step, then ``eos``. A request starts the script over: the scheduler opens or restores a
    sequence for it and takes a snapshot one token before its prompt's end (the pick of that first prefill is
    discarded). A forced continuation (a prefill from the current position: the thinking budget) goes on with the
    script where it was. Has snapshot/restore, as the CPU engine's sequences do."""

    def __init__(self, engine):
        self.engine, self.at, self.position = engine, 0, 0
        self.prompts = engine.prompts

    def _next(self) -> int:
        script = self.engine.script
        token = script[self.at] if self.at < len(script) else self.engine.eos
        self.at += 1
        return token

    def prefill(self, prompt, params, history=None) -> int:
        self.prompts.append(list(prompt))
        self.position += len(prompt)
        return self._next()

    def decode(self, first, n, params, history):
        for _ in range(n):
            self.position += 1
            token = self._next()
            history.append(token)
            yield [token]

    def snapshot(self):
        self.at = 0
        return self.position

    def restore(self, snap) -> None:
        self.position, self.at = snap, 0


class ScriptedEngine(Engine):
    """An engine double: every sequence emits ``tokenizer.encode(text)`` then ``eos``."""

    name, device, reserve = "a scripted engine double", "cpu", 0

    def __init__(self, config, max_context: int, eos: int):
        self.config, self.max_context, self.eos = config, max_context, eos
        self.script: list[int] = []
        self.prompts: list[list[int]] = []

    def sequence(self) -> ScriptedSequence:
        return ScriptedSequence(self)

    def close(self) -> None:
        pass


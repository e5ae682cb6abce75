"""Checkpoint writes survive kill -9: a writer killed mid-write (SIGKILL, no cleanup of its own) leaves the old
checkpoint loadable, and the next write beside it removes what the killed one left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lucegen.cli import main
from lucegen.model.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TENSOR = "layers.3.self_attn.q_proj.weight"

# Runs `lucegen init-weights` with one function wrapped to announce itself and stop for good on its Nth call, so the
# parent kills the writer at a known point: in the middle of the weights, or with every file written but not yet
# swapped in.
PAUSING_WRITER = """
import importlib, sys, time
module, name, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
target = importlib.import_module(module)
real = getattr(target, name)
seen = 0
def pausing(*args, **kwargs):
    global seen
    seen += 1
    if seen == calls:
        print("PAUSED", flush=True)
        time.sleep(600)
    return real(*args, **kwargs)
setattr(target, name, pausing)
from lucegen.cli import main
sys.exit(main(sys.argv[4:]))
"""


def kill_writer_at(module: str, name: str, calls: int, argv: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", PAUSING_WRITER, module, name, str(calls), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline().decode()
        assert line == "PAUSED\n", (line, proc.stderr.read().decode() if proc.poll() is not None else "")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def leftovers(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


def init(fmt: str, out: Path, seed: int) -> list[str]:
    return ["init-weights", "--preset", "tiny", "--format", fmt, "--out", str(out), "--seed", str(seed), "--quiet"]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """The tensor's values for seed 1 (the old checkpoint) and seed 2 (the new)."""
    base = tmp_path_factory.mktemp("seeds")
    out = {}
    for seed in (1, 2):
        assert main(init("safetensors", base / f"s{seed}", seed)) == 0
        out[seed] = load_checkpoint(base / f"s{seed}").bf16(TENSOR)
    assert not np.array_equal(out[1], out[2])
    return out


@pytest.mark.parametrize("where", [
    ("lucegen.model.init_weights", "init_tensor", 5),  # in the middle of model.safetensors
    ("lucegen.atomic", "_fsync_dir", 1),  # every file written and fsynced, the directory not yet swapped in
])
def test_a_killed_safetensors_write_keeps_the_old_checkpoint(tmp_path, seeds, where):
    ck = tmp_path / "ck"
    assert main(init("safetensors", ck, 1)) == 0
    before = sorted(p.name for p in ck.iterdir())
    kill_writer_at(*where, init("safetensors", ck, 2))
    assert len(leftovers(ck)) == 1  # the killed writer's temp directory, beside the checkpoint
    assert sorted(p.name for p in ck.iterdir()) == before
    np.testing.assert_array_equal(load_checkpoint(ck).bf16(TENSOR), seeds[1])
    assert main(init("safetensors", ck, 2)) == 0  # the next run removes it and writes the new checkpoint
    assert leftovers(ck) == [] and sorted(p.name for p in ck.iterdir()) == before
    np.testing.assert_array_equal(load_checkpoint(ck).bf16(TENSOR), seeds[2])


def test_a_killed_first_write_leaves_no_directory(tmp_path):
    ck = tmp_path / "new"
    kill_writer_at("lucegen.model.init_weights", "init_tensor", 5, init("safetensors", ck, 1))
    assert not ck.exists() and len(leftovers(ck)) == 1
    assert main(init("safetensors", ck, 1)) == 0
    assert leftovers(ck) == [] and load_checkpoint(ck).config.num_layers == 4


def test_a_killed_gguf_write_keeps_the_old_file(tmp_path, seeds):
    gguf = tmp_path / "t.gguf"
    assert main(init("gguf", gguf, 1)) == 0
    kill_writer_at("lucegen.model.quant", "quantize", 5, init("gguf", gguf, 2))
    assert len(leftovers(gguf)) == 1 and leftovers(gguf)[0].endswith(".tmp")
    np.testing.assert_array_equal(load_checkpoint(gguf).bf16(TENSOR), seeds[1])
    assert main(init("gguf", gguf, 2)) == 0
    assert leftovers(gguf) == []
    np.testing.assert_array_equal(load_checkpoint(gguf).bf16(TENSOR), seeds[2])


def test_a_live_writers_temp_files_are_left_alone(tmp_path):
    """Only a dead process's temp files are stale: one of a writer still running (here: this process) stays."""
    from lucegen.atomic import remove_stale

    ck = tmp_path / "ck"
    live = tmp_path / f".ck.{os.getpid()}.abc123.tmp"
    live.mkdir()
    dead = tmp_path / ".ck.999999999.abc123.tmp"  # no such process id
    dead.mkdir()
    other = tmp_path / ".other.999999999.abc123.tmp"
    other.write_text("x")
    assert remove_stale(ck) == [dead]
    assert live.exists() and not dead.exists() and other.exists()
    # a swap killed between its two renames (no exchange): the old directory comes back
    old = tmp_path / ".ck.999999999.abc123.old"
    old.mkdir()
    (old / "config.json").write_text("{}")
    assert remove_stale(ck) == [old] and (ck / "config.json").read_text() == "{}"


@pytest.mark.parametrize("exchange", [True, False])
def test_atomic_directory_replaces_whole_and_keeps_other_entries(tmp_path, monkeypatch, exchange):
    """With the atomic exchange and without (two renames): the new files replace the old, entries the writer does not
    produce are carried over, and an error inside leaves the old directory as it was."""
    from lucegen import atomic

    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    final = tmp_path / "d"
    final.mkdir()
    (final / "a").write_text("old a")
    (final / "notes.txt").write_text("mine")
    with atomic.atomic_directory(final) as tmp:
        atomic.atomic_write(tmp / "a", "new a")
        atomic.atomic_write(tmp / "b", "new b")
        assert (final / "a").read_text() == "old a" and not (final / "b").exists()
    assert {p.name: p.read_text() for p in final.iterdir()} == {"a": "new a", "b": "new b", "notes.txt": "mine"}
    with pytest.raises(RuntimeError):
        with atomic.atomic_directory(final) as tmp:
            atomic.atomic_write(tmp / "a", "newer a")
            raise RuntimeError("writer failed")
    assert (final / "a").read_text() == "new a" and leftovers(final) == []

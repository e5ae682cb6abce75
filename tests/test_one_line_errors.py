"""Inputs that used to end in a traceback end in one ``lucegen: error:`` line (exit 2); a closed pipe ends quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lucegen.cli import PIPE_CLOSED, main
from lucegen.errors import CheckpointError
from lucegen.model.tokenizer import tokenizer_from_gguf
from lucegen.model.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("lucegen: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("text, kind", [("[1, 2]", "array"), ("null", "null"), ("3", "number"), ('"x"', "string")])
def test_config_json_that_is_not_an_object(tiny, tmp_path, capsys, text, kind):
    model = tmp_path / "m"
    model.mkdir()
    for f in (tiny / "st").iterdir():
        (model / f.name).symlink_to(f)
    (model / "config.json").unlink()
    (model / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=f"config.json: expected a JSON object, got {kind}"):
        load_tokenizer(model)
    assert main(["run", "--model", str(model), "--prompt", "hi", "--target", "sm_90"]) == 2
    assert f"config.json: expected a JSON object, got {kind}" in one_line(capsys)


def test_a_flipped_byte_in_the_gguf_vocabulary(tiny, tmp_path, capsys):
    """Bytes across the token strings flipped in turn: a clean error or a tokenizer, never a bare Exception."""
    source = tiny / "t.gguf"
    data = bytearray(source.read_bytes())
    start = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens")
    end = data.index(b"tokenizer.ggml.token_type")
    bad = tmp_path / "bad.gguf"
    outcomes = set()
    for i in range(start, end, 97):
        mutated = bytearray(data)
        mutated[i] ^= 0x01  # stays ASCII: another token, or a duplicate of one
        bad.write_bytes(mutated)
        try:
            tokenizer_from_gguf(bad)
            outcomes.add("loads")
        except CheckpointError as exc:
            assert str(exc).startswith(f"{bad}: "), exc
            outcomes.add("BPE" if "does not form a BPE tokenizer" in str(exc) else "error")
    # the case the issue names: a flipped token leaves a merge whose token is gone (the BPE constructor refuses)
    assert "BPE" in outcomes, outcomes


def test_init_weights_into_an_unwritable_place(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for fmt, out in (("safetensors", blocker / "sub"), ("gguf", blocker / "sub" / "t.gguf"),
                     ("gguf", blocker / "t.gguf")):
        assert main(["init-weights", "--preset", "tiny", "--format", fmt, "--out", str(out), "--quiet"]) == 2
        assert f"{blocker}" in (err := one_line(capsys)) and ": cannot write: " in err


def test_a_reader_that_closes_the_pipe_ends_it_quietly():
    """`lucegen show sm_121 | head`: stdout's reader is gone before the command writes; no traceback, exit 141."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "lucegen.cli", "show", "sm_121"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    proc.stdout.close()  # before the interpreter has even started: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == PIPE_CLOSED and err == ""
    shell = subprocess.run(f"'{sys.executable}' -m lucegen.cli targets | head -1", shell=True, env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert shell.stderr == "" and shell.stdout.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["bogus"], "argument COMMAND: invalid choice: 'bogus'"),
    (["show"], "the following arguments are required: name"),
    (["init-weights", "--preset", "tiny", "--seed", "x", "--out", "o"], "argument --seed: invalid int value: 'x'"),
    (["targets", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_usage_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    assert message in one_line(capsys)

"""`lucegen run` / `lucegen bench decode`: bad input is one clear line and exit code 2, before any GPU work."""

from __future__ import annotations

import pytest

from lucegen.cli import main
from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import write_hf_checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mk-cli") / "tiny"
    write_hf_checkpoint(ModelConfig.preset("tiny"), out, seed=0, progress=False)
    return out


def run_cli(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err


def test_prompt_longer_than_context_is_refused(tiny_dir, capsys):
    code, err = run_cli(["run", "--model", str(tiny_dir), "--prompt", "def f(x): return x * 2", "--max-context", "2",
                         "--max-tokens", "1"], capsys)
    assert code == 2
    assert err.startswith("lucegen: error: the prompt has") and "--max-context 2" in err
    assert "Traceback" not in err


def test_generation_past_context_is_refused(tiny_dir, capsys):
    code, err = run_cli(["run", "--model", str(tiny_dir), "--prompt", "hello", "--max-context", "4",
                         "--max-tokens", "64"], capsys)
    assert code == 2 and "exceed --max-context 4" in err


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    code, err = run_cli(["run", "--model", str(tmp_path / "nope"), "--prompt", "hi"], capsys)
    assert code == 2 and err.startswith("lucegen: error:") and "nope" in err


@pytest.mark.parametrize("flag", ["--gen-tokens", "--prompt-tokens", "--repeats"])
def test_bench_refuses_nonpositive_counts(tiny_dir, capsys, flag):
    code, err = run_cli(["bench", "decode", "--model", str(tiny_dir), flag, "0", "--no-hf"], capsys)
    assert code == 2 and f"{flag} must be at least 1" in err


def test_run_without_a_gpu_fails_cleanly(tiny_dir, capsys):
    from tests.conftest import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible")
    code, err = run_cli(["run", "--model", str(tiny_dir), "--prompt", "hello", "--max-tokens", "2"], capsys)
    assert code == 2 and err.startswith("lucegen: error:") and "Traceback" not in err


def test_draft_needs_the_prefill_kernels(tiny_dir, tmp_path, capsys):
    code, err = run_cli(["run", "--model", str(tiny_dir), "--prompt", "hello", "--draft", str(tmp_path),
                         "--prefill", "megakernel"], capsys)
    assert code == 2 and "--draft needs --prefill kernels" in err


@pytest.mark.parametrize("command", [["run", "--prompt", "hello"], ["bench", "dflash"]])
@pytest.mark.parametrize("extra", [[], ["--draft", "D"]])
def test_draft_ring_needs_a_draft_and_a_positive_size(tiny_dir, capsys, command, extra):
    ring = "0" if extra else "64"  # without a draft even a good size is refused; with one, 0 is
    code, err = run_cli(command + ["--model", str(tiny_dir)] + extra + ["--draft-ring", ring], capsys)
    assert code == 2 and f"--draft-ring needs --draft and at least 1 position, got {ring}" in err

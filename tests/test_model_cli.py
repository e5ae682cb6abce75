"""``lucegen init-weights`` end to end, and its one-line errors."""

from __future__ import annotations

import numpy as np

from lucegen.cli import main
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.tokenizer import load_tokenizer


def test_init_weights_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["init-weights", "--preset", "tiny", "--format", "safetensors", "--out", str(tmp_path / "t"),
                 "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert "100%" in err and "wrote" in err  # progress on a non-TTY: percentage lines
    ck = load_checkpoint(tmp_path / "t")
    assert ck.config.num_layers == 4 and ck.config.eos_token_id == 0
    tok = load_tokenizer(tmp_path / "t")
    assert max(tok.encode("hello world, 12345")) < ck.config.vocab_size
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    # same seed, GGUF: same weights
    assert main(["init-weights", "--preset", "tiny", "--format", "gguf", "--out", str(tmp_path / "t.gguf"),
                 "--seed", "3", "--quiet"]) == 0
    g = load_checkpoint(tmp_path / "t.gguf")
    np.testing.assert_array_equal(g.bf16("layers.3.self_attn.q_proj.weight"),
                                  ck.bf16("layers.3.self_attn.q_proj.weight"))


def test_init_weights_user_errors_are_one_line(tmp_path, capsys):
    assert main(["init-weights", "--preset", "tiny", "--format", "safetensors", "--quant", "q4_k_m",
                 "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith("lucegen: error: --quant q4_k_m: safetensors")
    (tmp_path / "file").write_text("x")
    assert main(["init-weights", "--preset", "tiny", "--format", "safetensors", "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert not list(tmp_path.glob(".*.tmp"))  # nothing half-written left behind

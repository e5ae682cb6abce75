"""`lucegen targets`, `show`, `new-target` and `build` from the command line: output, exit codes, nothing written
on bad input, and `build --check` naming stale files without touching them."""

from __future__ import annotations

import pytest

import lucegen.codegen
import lucegen.commands.targets
import lucegen.target
from lucegen.cli import main
from lucegen.target import TARGETS_DIR


@pytest.fixture
def generated(tmp_path, monkeypatch):
    """Point generated/ at a temporary directory."""
    out = tmp_path / "generated"
    monkeypatch.setattr(lucegen.codegen, "GENERATED_DIR", out)
    return out


def test_targets_table(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for name in ("sm_75", "sm_86", "sm_89", "sm_90", "sm_110", "sm_120", "sm_121", "gfx1100", "gfx1151"):
        assert f"\n{name} " in out
    assert "132x512" in out and "3350" in out


def test_show_includes_derived_values(capsys):
    assert main(["show", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "blocks = 132    # derived: compute_units x blocks_per_cu = 132 x 1" in out
    assert "compute capability 9.0" in out and 'arch = "sm_90"' in out


def test_new_target_writes_a_valid_descriptor_and_refuses_to_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", str(tmp_path))  # the user directory, where an installed lucegen
    monkeypatch.setattr(lucegen.commands.targets, "source_checkout", lambda: None)  # writes new descriptors
    assert main(["new-target", "rtx4080", "--like", "sm_89"]) == 0
    made = lucegen.target.load_target(tmp_path / "rtx4080.toml")
    assert made.name == "rtx4080" and made.arch == "sm_89"
    assert "rtx4080" in lucegen.target.list_targets()
    before = (tmp_path / "rtx4080.toml").read_text()
    capsys.readouterr()
    assert main(["new-target", "rtx4080", "--like", "sm_90"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lucegen: error: ") and "already exists" in err and err.count("\n") == 1
    assert (tmp_path / "rtx4080.toml").read_text() == before
    assert main(["new-target", "bad name!", "--like", "sm_89"]) == 2
    assert main(["new-target", "x", "--like", "nope"]) == 2
    assert not (tmp_path / "x.toml").exists()


def test_bad_descriptor_one_line_exit_2_nothing_written(tmp_path, generated, capsys):
    text = (TARGETS_DIR / "sm_90.toml").read_text().replace('name = "sm_90"', 'name = "bad"')
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("threads = 512", "threads = 500"))
    assert main(["build", "--target", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"lucegen: error: {bad}: megakernel.threads: 500 is not a multiple of warp_size 32\n"
    assert not generated.exists()
    # one bad descriptor among good ones: still nothing written
    assert main(["build", "--target", "sm_86", "--target", str(bad)]) == 2
    assert not generated.exists()


def test_build_then_check_detects_stale_and_orphan_files(generated, capsys, require_compiler):
    require_compiler(lucegen.target.load_target("gfx1100"))
    assert main(["build", "--target", "sm_86", "--target", "gfx1100"]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm_bf16" in out and "total: 2 target(s)" in out
    source = generated / "sm_86" / "small_kernels.cu"
    assert source.is_file() and (generated / "gfx1100" / "small_kernels.hip").is_file()
    assert main(["build", "--target", "sm_86", "--target", "gfx1100", "--check"]) == 0

    source.write_text(source.read_text() + "// hand edit\n")
    orphan = generated / "sm_86" / "retired_family.cu"
    orphan.write_text("// old\n")
    capsys.readouterr()
    assert main(["build", "--target", "sm_86", "--check"]) == 1
    err = capsys.readouterr().err
    assert "generated/sm_86/small_kernels.cu (differs from its template)" in err
    assert "generated/sm_86/retired_family.cu (no kernel family produces it)" in err
    assert source.read_text().endswith("// hand edit\n") and orphan.exists()  # --check changes nothing

    assert main(["build", "--target", "sm_86", "--quiet"]) == 0
    assert not source.read_text().endswith("// hand edit\n") and not orphan.exists()
    assert main(["build", "--target", "sm_86", "--check"]) == 0

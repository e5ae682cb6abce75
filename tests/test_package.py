"""lucegen as an installed package: the wheel holds every template and descriptor, user descriptors are found on
$LUCEGEN_TARGETS_PATH (a name given twice is an error), ``new-target`` writes where the descriptor belongs, and
``build`` writes sources to --out, into generated/ of a checkout alone, never into an installed package."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import lucegen
import lucegen.codegen
import lucegen.commands.build
import lucegen.commands.targets
from lucegen import descriptor_paths
from lucegen.cli import main
from lucegen.errors import DescriptorError
from lucegen.target import TARGETS_DIR, list_targets, load_target

REPO = lucegen.PACKAGE_DIR.parent


def _descriptor(directory: Path, name: str, like: str = "sm_86") -> Path:
    """A valid descriptor named ``name`` in ``directory``, from a packaged one."""
    directory.mkdir(parents=True, exist_ok=True)
    text = (TARGETS_DIR / f"{like}.toml").read_text().replace(f'name = "{like}"', f'name = "{name}"')
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """lucegen as from a wheel: no source checkout, and a generated/ that must stay untouched."""
    monkeypatch.setattr(lucegen.commands.build, "source_checkout", lambda: None)
    monkeypatch.setattr(lucegen.commands.targets, "source_checkout", lambda: None)
    monkeypatch.setattr(lucegen.codegen, "GENERATED_DIR", tmp_path / "site-packages" / "generated")
    return tmp_path / "site-packages"


# ---- the wheel -------------------------------------------------------------------------------------------------
def test_wheel_holds_every_template_descriptor_and_module(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "lucegen", src / "lucegen", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("lucegen-*.whl")
    members = set(zipfile.ZipFile(wheel).namelist())
    package = src / "lucegen"
    shipped = [p for p in package.rglob("*") if p.is_file()]
    data = [p for p in shipped if p.is_relative_to(package / "templates") or p.is_relative_to(package / "targets")]
    assert len([p for p in data if p.suffix == ".toml"]) >= 9 and len([p for p in data if p.suffix == ".j2"]) >= 10
    missing = sorted(str(p.relative_to(src)) for p in shipped if str(p.relative_to(src)) not in members)
    assert missing == [], f"files of the package the wheel leaves out: {missing}"
    assert {"lucegen/devtools/__init__.py", "lucegen/devtools/sass_diff.py"} <= members


def test_package_data_is_read_through_the_package():
    assert lucegen.TARGETS_DIR == lucegen.PACKAGE_DIR / "targets" and (lucegen.TARGETS_DIR / "sm_90.toml").is_file()
    assert (lucegen.TEMPLATES_DIR / "kernels").is_dir()
    assert lucegen.source_checkout() == REPO  # these tests run from the checkout


# ---- user descriptors --------------------------------------------------------------------------------------------
def test_user_directories_join_the_packaged_descriptors(tmp_path, monkeypatch, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    _descriptor(first, "chip_a")
    _descriptor(second, "chip_b", like="gfx1151")
    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", f"{first}{descriptor_paths.os.pathsep}{second}")
    names = list_targets()
    assert {"sm_90", "gfx1151", "chip_a", "chip_b"} <= set(names)
    assert load_target("chip_b").arch == "gfx1151" and load_target("chip_b").path == str(second / "chip_b.toml")
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "  user  " in rows["chip_a"] and "  package  " in rows["sm_90"]
    assert f"user:    {first}" in out and f"user:    {second}" in out
    assert f"package: {TARGETS_DIR}" in out


def test_user_descriptor_with_a_taken_name_is_an_error_naming_both_files(tmp_path, monkeypatch, capsys):
    shadow = _descriptor(tmp_path / "mine", "sm_90", like="sm_90")
    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", str(tmp_path / "mine"))
    with pytest.raises(DescriptorError) as err:
        list_targets()
    assert str(shadow) in str(err.value) and str(TARGETS_DIR / "sm_90.toml") in str(err.value)
    assert main(["show", "sm_86"]) == 2  # a name found twice stops every lookup, not only its own
    assert str(shadow) in capsys.readouterr().err

    a, b = _descriptor(tmp_path / "a", "same"), _descriptor(tmp_path / "b", "same")
    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", f"{a.parent}{descriptor_paths.os.pathsep}{b.parent}")
    with pytest.raises(DescriptorError, match="rename one of the two") as err:
        load_target("same")
    assert str(a) in str(err.value) and str(b) in str(err.value)


def test_user_directory_defaults_to_the_config_dir_and_empty_means_none(tmp_path, monkeypatch):
    monkeypatch.delenv("LUCEGEN_TARGETS_PATH")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert descriptor_paths.user_dirs() == [tmp_path / "config" / "lucegen" / "targets"]
    _descriptor(tmp_path / "config" / "lucegen" / "targets", "xdg_chip")
    assert "xdg_chip" in list_targets()
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert descriptor_paths.user_dirs() == [tmp_path / "home" / ".config" / "lucegen" / "targets"]
    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", "")
    assert descriptor_paths.user_dirs() == [] and "xdg_chip" not in list_targets()


def test_no_descriptor_at_all_is_an_error_not_an_empty_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(descriptor_paths, "TARGETS_DIR", tmp_path / "empty")
    assert main(["targets"]) == 2
    err = capsys.readouterr().err
    assert "no chip descriptors found" in err and str(tmp_path / "empty") in err


# ---- new-target ---------------------------------------------------------------------------------------------------
def test_new_target_goes_to_the_package_in_a_checkout_and_to_the_user_directory_installed(tmp_path, monkeypatch,
                                                                                         installed, capsys):
    monkeypatch.setattr(lucegen.commands.targets, "source_checkout", lambda: REPO)
    assert lucegen.commands.targets.new_target_dir() == TARGETS_DIR  # to be committed with the code
    monkeypatch.setattr(lucegen.commands.targets, "source_checkout", lambda: None)
    user = tmp_path / "config" / "targets"
    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", f"{user}{descriptor_paths.os.pathsep}{tmp_path / 'other'}")
    assert main(["new-target", "my_chip", "--like", "gfx1100"]) == 0
    assert (user / "my_chip.toml").is_file() and "lucegen show my_chip" in capsys.readouterr().out
    assert load_target("my_chip").arch == "gfx1100"
    assert main(["new-target", "sm_89", "--like", "sm_86"]) == 2  # a packaged name, even in another directory
    err = capsys.readouterr().err
    assert str(TARGETS_DIR / "sm_89.toml") in err and not (user / "sm_89.toml").exists()

    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", "")
    assert main(["new-target", "other", "--like", "sm_86"]) == 2
    assert "--dir" in capsys.readouterr().err


def test_new_target_dir_option_overrides(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LUCEGEN_TARGETS_PATH", str(tmp_path / "user"))
    assert main(["new-target", "elsewhere_chip", "--like", "sm_90", "--dir", str(tmp_path / "there")]) == 0
    path = tmp_path / "there" / "elsewhere_chip.toml"
    assert load_target(path).name == "elsewhere_chip"
    out = capsys.readouterr().out
    assert f"lucegen show {path}" in out and "LUCEGEN_TARGETS_PATH" in out  # not searched: named by path
    assert "elsewhere_chip" not in list_targets()


# ---- build --out ----------------------------------------------------------------------------------------------------
def test_build_out_writes_sources_anywhere_and_check_reads_them(tmp_path, capsys):
    out = tmp_path / "rendered"
    assert main(["build", "--target", "sm_86", "--out", str(out), "--quiet"]) == 0
    source = out / "sm_86" / "small_kernels.cu"
    assert source.is_file() and f"written to {out}" in capsys.readouterr().out
    assert source.read_text() == (REPO / "generated" / "sm_86" / "small_kernels.cu").read_text()
    assert main(["build", "--target", "sm_86", "--out", str(out), "--check"]) == 0
    source.write_text("// edited\n")
    assert main(["build", "--target", "sm_86", "--out", str(out), "--check"]) == 1
    assert "rendered/sm_86/small_kernels.cu (differs from its template)" in capsys.readouterr().err


def test_installed_build_writes_nothing_without_out_and_check_needs_a_checkout(installed, capsys):
    assert main(["build", "--target", "sm_86", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no sources written" in out and "--out DIR" in out
    assert not installed.exists()
    assert main(["build", "--target", "sm_86", "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lucegen: error: --check") and "source checkout" in err and err.count("\n") == 1

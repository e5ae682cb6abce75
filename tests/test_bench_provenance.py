"""Every ``lucegen bench ... --json`` file is headed by where it came from (lucegen/bench/provenance.py): the bench,
the commit (or the package version outside a checkout), the machine (the GPU's name) and the UTC date."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import lucegen
from lucegen.bench import provenance as provenance_module
from lucegen.bench.provenance import commit, provenance
from lucegen.commands.bench import write_json
from lucegen.runtime import device as device_module

from test_host_dry_run import host

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_commit_is_the_checkouts_head_else_the_package_version(monkeypatch):
    monkeypatch.delenv("LUCEGEN_COMMIT", raising=False)
    head = git("rev-parse", "--short=7", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "lucegen") != ""
    assert commit() == head + ("-dirty" if dirty else "")
    monkeypatch.setattr(provenance_module, "source_checkout", lambda: None)
    assert commit() == f"lucegen {lucegen.__version__}"


def test_commit_outside_git_falls_back_to_the_version(monkeypatch, tmp_path):
    monkeypatch.delenv("LUCEGEN_COMMIT", raising=False)
    monkeypatch.setattr(provenance_module, "source_checkout", lambda: tmp_path)  # a directory git does not know
    assert commit() == f"lucegen {lucegen.__version__}"
    copy = ROOT / "tests" / "data"  # inside this repository but no checkout of its own: not the repository's HEAD
    monkeypatch.setattr(provenance_module, "source_checkout", lambda: copy)
    assert commit() == f"lucegen {lucegen.__version__}"


def test_commit_named_by_the_environment_wins(monkeypatch):
    """A copy of a checkout without its .git (as a device runner ships it) records the commit it was copied from."""
    monkeypatch.setenv("LUCEGEN_COMMIT", " 644985e ")
    assert commit() == "644985e"
    monkeypatch.setattr(provenance_module, "source_checkout", lambda: None)
    assert commit() == "644985e"
    monkeypatch.setenv("LUCEGEN_COMMIT", "")
    assert commit() == f"lucegen {lucegen.__version__}"


def test_provenance_fields_and_the_json_they_head(tmp_path, monkeypatch):
    monkeypatch.delenv("LUCEGEN_COMMIT", raising=False)
    stamp = provenance("prefill", "NVIDIA H200", "Qwen3.5-0.8B BF16")
    assert stamp["bench"] == "prefill" and stamp["machine"] == "NVIDIA H200" and stamp["label"] == "Qwen3.5-0.8B BF16"
    assert stamp["date"] == datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = tmp_path / "r.json"
    write_json(out, {"device": "NVIDIA H100 80GB HBM3", "rows": [{"tokens": 520, "tok_s": 1.0}]}, "prefill")
    written = json.loads(out.read_text())
    assert list(written)[:5] == ["bench", "label", "commit", "machine", "date"]
    assert written["machine"] == "NVIDIA H100 80GB HBM3" and written["label"] is None
    assert written["commit"] == commit() and written["rows"] == [{"tokens": 520, "tok_s": 1.0}]
    write_json(out, {"url": "http://x", "rows": []}, "serve")
    assert json.loads(out.read_text())["machine"] is None  # a client: the server's device is not known here


def test_bench_decode_json_carries_the_provenance(tiny, tmp_path, monkeypatch):
    """`lucegen bench decode --json F --label L` on the host device: the file names the device it ran on."""
    from lucegen.cli import main

    monkeypatch.delenv("LUCEGEN_COMMIT", raising=False)
    devices = []

    def open_host(cls, target=None):
        devices.append(host(target or "sm_90"))
        return devices[-1]

    monkeypatch.setattr(device_module.Device, "open", classmethod(open_host))
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--model", str(tiny / "st"), "--no-hf", "--prompt-tokens", "4", "--gen-tokens",
                 "8", "--repeats", "1", "--json", str(out), "--label", "tiny BF16"]) == 0
    result = json.loads(out.read_text())
    assert result["bench"] == "decode" and result["label"] == "tiny BF16"
    assert result["machine"] == result["device"] == devices[0].name and result["commit"] == commit()
    assert result["gen_tokens"] == 8 and result["tok_s"] > 0


def test_dirty_means_the_package_differs_not_the_results_written_beside_it(monkeypatch, tmp_path):
    monkeypatch.delenv("LUCEGEN_COMMIT", raising=False)
    (tmp_path / "lucegen").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "lucegen" / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "decode.json").write_text("{}\n")

    def in_repo(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    in_repo("init", "-q")
    in_repo("add", "-A")
    in_repo("commit", "-qm", "start")
    head = in_repo("rev-parse", "--short=7", "HEAD")
    monkeypatch.setattr(provenance_module, "source_checkout", lambda: tmp_path)
    (tmp_path / "docs" / "decode.json").write_text('{"tok_s": 1}\n')  # a bench's result, written before the next
    assert commit() == head
    (tmp_path / "lucegen" / "code.py").write_text("x = 2\n")
    assert commit() == head + "-dirty"

"""`lucegen build` compiles in worker processes with a line per module, and a compile that misses the cache says
what it compiles (the first run of a model)."""

from __future__ import annotations

import logging

from lucegen.cli import main


def test_build_reports_each_module(tmp_path, capsys):
    out = tmp_path / "rendered"
    assert main(["build", "--target", "sm_86", "--out", str(out), "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("lucegen: [")]
    total = int(lines[0].split("/")[1].split("]")[0])
    assert len(lines) == total > 1
    assert {l.split("]")[0] for l in lines} == {f"lucegen: [{i}/{total}" for i in range(1, total + 1)}
    assert any(" megakernel " in l for l in lines) and any("small_kernels" in l for l in lines)
    capsys.readouterr()
    assert main(["build", "--target", "sm_86", "--out", str(out), "--jobs", "2", "--quiet"]) == 0
    assert "lucegen: [" not in capsys.readouterr().err


def test_a_cache_miss_says_what_it_compiles(tmp_path, monkeypatch, caplog):
    from lucegen.compile import compile_source
    from lucegen.target import load_target

    monkeypatch.setenv("LUCEGEN_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void probe(float *x) { x[threadIdx.x] += 1.0f; }\n'
    target = load_target("sm_86")
    with caplog.at_level(logging.INFO, "lucegen"):
        first = compile_source(target, "probe", source, template="probe.cu.j2")
        second = compile_source(target, "probe", source, template="probe.cu.j2")
    messages = [r.getMessage() for r in caplog.records]
    assert not first.cached and second.cached
    assert len(messages) == 1 and messages[0].startswith("compiling probe.cu.j2 for sm_86")

"""Builds running at once on one cache compile each module once; two cold AMD builds give the same code object."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from lucegen import codegen
from lucegen.compile import compile_source
from lucegen.target import load_target

ROOT = Path(__file__).resolve().parents[1]

SOURCE = """extern "C" __global__ void scale(float* a, float s) { a[blockIdx.x * blockDim.x + threadIdx.x] *= s; }
extern "C" __global__ void shift(float* a, float s) { a[blockIdx.x * blockDim.x + threadIdx.x] += s; }
"""

# Compiles SOURCE for sm_86 through the cache with the back end's compile wrapped to log each run to a file and take
# a second, so that two of these started together overlap in their compile if nothing keeps them apart.
BUILDER = """
import hashlib, os, sys, time
from lucegen.compile import compile_source, nvrtc
from lucegen.target import load_target
log, source = sys.argv[1], sys.argv[2]
real = nvrtc.compile
def logged(*args, **kwargs):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(1.0)
    return real(*args, **kwargs)
nvrtc.compile = logged
module = compile_source(load_target("sm_86"), "concurrent", source)
print(hashlib.sha256(module.binary).hexdigest(), module.cached)
"""


def test_two_builds_at_once_compile_each_module_once(tmp_path):
    log = tmp_path / "compiles.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), LUCEGEN_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(log), SOURCE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    assert len(log.read_text().splitlines()) == 1  # one process compiled, the other waited and read its entry
    digests = {out.split()[0] for out, _ in results}
    cached = sorted(out.split()[1] for out, _ in results)
    assert len(digests) == 1 and cached == ["False", "True"]


def test_two_cold_amd_builds_are_identical(tmp_path, monkeypatch, require_compiler):
    """The code object does not depend on the temp directory clang compiled in (its __hip_cuid_ symbol did)."""
    target = load_target("gfx1100")
    require_compiler(target)
    source = codegen.render_string(target, '{% include "common/prelude.cuh.j2" %}\n') + SOURCE
    digests = set()
    for build in range(2):
        monkeypatch.setenv("LUCEGEN_CACHE_DIR", str(tmp_path / f"cache{build}"))
        module = compile_source(target, "reproducible", source)
        assert not module.cached and {k.name for k in module.kernels} == {"scale", "shift"}
        digests.add(hashlib.sha256(module.binary).hexdigest())
    assert len(digests) == 1

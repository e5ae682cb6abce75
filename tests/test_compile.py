"""Every target's families compile (NVRTC for NVIDIA, clang-19 for AMD); compile errors show the failing line;
the cache survives corruption."""

from __future__ import annotations

import os

import pytest

from lucegen import codegen
from lucegen.compile import cache, compile_source
from lucegen.compile.elf import function_sizes
from lucegen.errors import CompileError
from lucegen.target import list_targets, load_target

TARGETS = list_targets()


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    """A cache directory of this module's own: CI measures the cold compile."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LUCEGEN_CACHE_DIR", str(tmp_path_factory.mktemp("lucegen-cache")))
        yield


@pytest.mark.parametrize("name", TARGETS)
def test_every_target_compiles(name, require_compiler):
    t = load_target(name)
    require_compiler(t)
    for fam, shape in ((f, s) for f in codegen.families(t) for s in codegen.shapes(t, f)):
        module = codegen.build(t, fam, shape)
        assert module.binary[:4] == b"\x7fELF"
        names = {k.name for k in module.kernels}
        assert names, f"{fam.name}: no kernels reported"
        for k in module.kernels:
            assert k.registers > 0 and k.code_bytes > 0, k
        if fam.name == "small_kernels":
            assert {"argmax_f32", f"rmsnorm_{t.compute_dtype}", f"matvec_{t.compute_dtype}"} <= names
            assert all(k.spills == 0 for k in module.kernels)
        assert function_sizes(module.binary).keys() >= names
        # a second compile is a cache hit with identical results
        again = codegen.build(t, fam, shape)
        assert again.cached and again.binary == module.binary and again.kernels == module.kernels


BROKEN = """extern "C" __global__ void ok(float* a) { a[0] = 1.0f; }
extern "C" __global__ void broken(float* a) {
  a[threadIdx.x] = undefined_name * 2.0f;
}
"""


@pytest.mark.parametrize("name", ["sm_90", "gfx1100"])
def test_compile_error_shows_template_target_log_and_line(name, require_compiler):
    t = load_target(name)
    require_compiler(t)
    source = BROKEN if t.is_nvidia else codegen.render_string(t, '{% include "common/prelude.cuh.j2" %}\n') + BROKEN
    with pytest.raises(CompileError) as e:
        compile_source(t, "broken", source, template="kernels/broken.cu.j2")
    message = str(e.value)
    assert "kernels/broken.cu.j2" in message and name in message
    assert "undefined_name" in message  # the compiler's log
    failing = next(line for line in message.splitlines() if line.startswith(">>"))
    assert "a[threadIdx.x] = undefined_name * 2.0f;" in failing


def test_resource_report_sees_shared_memory_and_registers():
    t = load_target("sm_90")
    src = """extern "C" __global__ void smem(float* a) {
      __shared__ float s[1024]; s[threadIdx.x] = a[threadIdx.x]; __syncthreads(); a[threadIdx.x] = s[1023 - threadIdx.x];
    }"""
    info = compile_source(t, "smem", src).kernel("smem")
    assert info.shared_bytes == 4096 and info.registers > 0


def test_cache_key_covers_source_options_and_arch():
    t = load_target("sm_90")
    src = 'extern "C" __global__ void k(int* a) { a[0] = 1; }'
    a = compile_source(t, "k", src)
    b = compile_source(t, "k", src + "\n// changed")
    c = compile_source(t, "k", src, options=("--use_fast_math",))
    d = compile_source(t, "k", src, arch="sm_90a")
    assert not b.cached and not c.cached and not d.cached
    assert compile_source(t, "k", src).cached and a.arch == "sm_90" and d.arch == "sm_90a"


def _entry_for(t, name, src):
    module = compile_source(t, name, src)
    entries = sorted(cache.cache_dir().glob("*.lgc"), key=os.path.getmtime)
    return module, entries


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_damaged_cache_entry_is_ignored_and_rewritten(damage):
    t = load_target("sm_86")
    src = f'extern "C" __global__ void k_{damage}(int* a) {{ a[0] = 7; }}'
    first = compile_source(t, f"k_{damage}", src)
    key_files = [p for p in cache.cache_dir().glob("*.lgc") if f"k_{damage}".encode() in p.read_bytes()]
    assert len(key_files) == 1
    path = key_files[0]
    data = path.read_bytes()
    assert cache.load(path.stem) is not None
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(b"LGC1" + os.urandom(200))
    again = compile_source(t, f"k_{damage}", src)
    assert not again.cached and again.binary == first.binary
    meta, binary = cache.load(path.stem)  # rewritten whole: passes its length and checksum checks
    assert binary == first.binary and meta["kernels"][0]["name"] == f"k_{damage}"
    assert compile_source(t, f"k_{damage}", src).cached


def test_killed_write_leaves_no_entry(monkeypatch):
    """A build killed mid-write (here: the write raises) leaves neither a partial entry nor a temp file."""
    t = load_target("sm_89")
    src = 'extern "C" __global__ void killed(int* a) { a[0] = 3; }'
    before = set(cache.cache_dir().iterdir()) if cache.cache_dir().exists() else set()

    def dying_fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", dying_fsync)
    with pytest.raises(KeyboardInterrupt):
        compile_source(t, "killed", src)
    monkeypatch.undo()
    assert set(cache.cache_dir().iterdir()) == before
    assert not compile_source(t, "killed", src).cached
    assert compile_source(t, "killed", src).cached


@pytest.mark.parametrize("name", [n for n in TARGETS if load_target(n).is_nvidia])
def test_cubin_report_agrees_with_ptxas_log(name):
    """The two sources of per-kernel resources agree; the cubin alone suffices when the log is empty (NVRTC 13.0
    reports ptxas info only for the first program compiled in a process)."""
    from lucegen.compile import nvrtc
    from lucegen.compile.elf import cubin_resources

    module = codegen.build(load_target(name), "small_kernels")
    from_cubin = cubin_resources(module.binary)
    assert set(from_cubin) == {k.name for k in module.kernels}
    for k in module.kernels:
        assert from_cubin[k.name][0] == k.registers and from_cubin[k.name][2] == k.shared_bytes, (k, from_cubin)
    assert sorted(nvrtc.kernel_infos("", module.binary), key=lambda k: k.name) == sorted(module.kernels,
                                                                                           key=lambda k: k.name)

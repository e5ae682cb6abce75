"""The scripts in examples/ run as a user runs them (a subprocess from the repository root), and say something
real: the kernels they compiled, the descriptor they refused, the properties they checked, the tokens they
generated. The GPU-only script skips cleanly without a GPU; its engine code, and the GPU path of generate.py, are
driven here on the host-only device (every launch checked against the compiled kernels, nothing computed)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import gpu_available
from test_host_dry_run import host  # a HostDevice whose downloads let a run go on

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, timeout: int = 900) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def example_module(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{Path(name).stem}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_has_a_docstring_and_a_test():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == ["add_a_chip.py", "build_a_chip.py", "generate.py", "property_test_kernel.py",
                       "speculative.py"], "a new example needs its test here"
    for name in scripts:
        assert example_module(name).__doc__.strip(), name


@pytest.mark.slow
def test_build_a_chip():
    out = run_example("build_a_chip.py", "sm_86")
    assert out.startswith("sm_86: NVIDIA GeForce RTX 3090")
    count = int(re.search(r"^(\d+) kernels compiled for sm_86$", out, re.M).group(1))
    rows = [line for line in out.splitlines()[2:-1] if line.strip()]
    assert count == len(rows) >= 10
    assert re.search(r"^rmsnorm_bf16\s+small_kernels\s+\d+\s+\d+\s+\d+\s+\d+$", out, re.M)


@pytest.mark.slow
def test_add_a_chip():
    out = run_example("add_a_chip.py", "--families", "small_kernels", "megakernel")
    assert "rtx4080: NVIDIA GeForce RTX 4080 (Ada Lovelace), sm_89, 76 SMs, 716.8 GB/s, megakernel grid 76 x 512" in out
    assert re.search(r"refused as it should be: .*broken\.toml: max_threads_per_block: 4096", out)
    assert re.search(r"^  megakernel\s+1 kernels", out, re.M)
    assert re.search(r"^built \d+ kernels in 2 families for rtx4080$", out, re.M)


def test_property_test_kernel():
    out = run_example("property_test_kernel.py", "--examples", "10")
    assert "chunked gated delta rule == recurrent reference: 10 examples passed" in out
    expected = "matches numpy within one ulp" if gpu_available() else "every launch checked against its cubin"
    assert re.search(rf"rmsnorm kernel on \S+: {expected}", out)


def test_generate_on_the_cpu():
    out = run_example("generate.py", "--cpu", "--prompt", "def f(x):", "--max-tokens", "8")
    found = re.search(r"(\d+) prompt tokens, 8 generated on the numpy reference \(CPU\): \[([\d, ]+)\]", out)
    assert found, out
    tokens = [int(t) for t in found.group(2).split(",")]
    assert len(tokens) == 8 and all(0 <= t < 512 for t in tokens)  # the tiny preset's vocabulary
    assert out.splitlines()[-1].startswith("def f(x):")


def test_speculative_without_a_gpu_skips_cleanly():
    if gpu_available():
        out = run_example("speculative.py", "--max-tokens", "24")
        assert "equal to greedy decoding: True" in out
    else:
        out = run_example("speculative.py")
        assert out.startswith("skipped: speculative decoding runs on an NVIDIA GPU")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from lucegen.cli import main

    root = tmp_path_factory.mktemp("example-models")
    assert main(["init-weights", "--preset", "tiny", "--format", "safetensors", "--out", str(root / "tiny"),
                 "--quiet"]) == 0
    assert main(["init-weights", "--preset", "tiny-q", "--format", "gguf", "--quant", "q4_k_m", "--out",
                 str(root / "tiny-q.gguf"), "--quiet"]) == 0
    assert main(["init-weights", "--preset", "dflash-tiny-q", "--out", str(root / "draft"), "--quiet"]) == 0
    return root


@pytest.mark.parametrize("chip", ["sm_90", "gfx1100"])
def test_the_gpu_paths_on_the_host_device(tiny_models, chip, require_compiler):
    """generate.py's GPU path and speculative.py's engine, on the host device of a descriptor: every launch is
    checked against its kernel, and closing the engines frees everything they allocated."""
    dev = host(chip)
    require_compiler(dev.target)
    tokens = example_module("generate.py").generate_on_gpu(tiny_models / "tiny", [1, 2, 3, 4], 6, device=dev,
                                                                  ignore_eos=True)
    assert len(tokens) == 6 and dev.launches and dev.allocated == 0
    dev = host(chip)
    spec, greedy, al = example_module("speculative.py").speculative_and_greedy(
        tiny_models / "tiny-q.gguf", tiny_models / "draft", list(np.arange(1, 20)), 12, budget=8, device=dev)
    assert len(spec) == len(greedy) == 12 and al >= 1
    launched = {name for name, *_ in dev.launches}
    assert {"draft_topk_merge", "tree_delta_rule"} <= launched and any(k.startswith("quant_gemm") for k in launched)
    assert dev.allocated == 0, f"{dev.allocated} bytes left allocated"

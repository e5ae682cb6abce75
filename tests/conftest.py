"""Shared test setup: ``gpu`` tests skip cleanly when no NVIDIA GPU is visible, the tests see the packaged chip
descriptors alone, and AMD compiles skip without clang-19 (``require_compiler``), naming the package to install."""

from __future__ import annotations

import functools
import os
from collections import Counter

import pytest

# No user descriptor directory (lucegen/descriptor_paths.py): a developer's own descriptors would otherwise join every
# test parametrised over list_targets(). Tests of the user directories set the variable themselves.
os.environ["LUCEGEN_TARGETS_PATH"] = ""


@functools.cache
def gpu_available() -> bool:
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def require_compiler():
    """``require_compiler(target)``: skip the test when ``target`` is an AMD chip and clang-19 is not installed (the
    reason names the Debian package); NVIDIA targets compile with NVRTC, a Python dependency, and never skip."""
    from lucegen.compile import hip

    def check(target) -> None:
        if target.is_amd and hip.find_clang() is None:
            pytest.skip(hip.MISSING_CLANG)

    return check


#: Outcomes of the fuzz suite's cases per generator (tests/test_fuzz.py fills it through the ``fuzz_counts``
#: fixture); printed as a table at the end of the run so that the CI log shows it.
FUZZ_COUNTS: dict[str, Counter] = {}
FUZZ_COLUMNS = ("cases", "loads same", "one-line error", "changed: undetectable", "traceback", "hang")


@pytest.fixture(scope="session")
def fuzz_counts() -> dict[str, Counter]:
    return FUZZ_COUNTS


def pytest_terminal_summary(terminalreporter):
    if not FUZZ_COUNTS:
        return
    width = max(len(g) for g in FUZZ_COUNTS) + 2
    terminalreporter.section("fuzz cases")
    terminalreporter.write_line("generator".ljust(width) + "".join(c.rjust(len(c) + 3) for c in FUZZ_COLUMNS))
    total: Counter = Counter()
    for generator, counts in sorted(FUZZ_COUNTS.items()):
        total.update(counts)
        terminalreporter.write_line(generator.ljust(width) + "".join(str(counts[c]).rjust(len(c) + 3)
                                                                      for c in FUZZ_COLUMNS))
    terminalreporter.write_line("total".ljust(width) + "".join(str(total[c]).rjust(len(c) + 3) for c in FUZZ_COLUMNS))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny safetensors checkpoint (``st/``) and its GGUF twin (``t.gguf``), written by init-weights; modules that
    need another tiny model define a ``tiny`` fixture of their own."""
    from lucegen.cli import main

    base = tmp_path_factory.mktemp("tiny")
    assert main(["init-weights", "--preset", "tiny", "--format", "safetensors", "--out", str(base / "st"),
                 "--quiet"]) == 0
    assert main(["init-weights", "--preset", "tiny", "--format", "gguf", "--out", str(base / "t.gguf"),
                 "--quiet"]) == 0
    return base


@pytest.fixture(scope="module")
def oa(server):
    """The official OpenAI client on the serve test module's ``server``."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def an(server):
    """The official Anthropic client on the serve test module's ``server``."""
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

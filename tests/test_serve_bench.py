"""``lucegen bench serve`` against a real ``lucegen serve`` subprocess on the tiny model: the table and the JSON,
and the prefix cache's effect on the second turn's TTFT (the server runs with one BLAS thread, so that a loaded
machine's thread contention does not hide a 300-token prefill behind a 20-token one)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serve_helpers import ROOT, start_server_process, write_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("serve") / "tiny")


def test_bench_serve_table_json_and_prefix_cache(tiny, tmp_path):
    proc, url = start_server_process(tiny, "--slots", "4", "--max-context", "2048",
                                     env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    try:
        out = tmp_path / "bench.json"
        run = subprocess.run([sys.executable, "-m", "lucegen.cli", "bench", "serve", "--url", url, "--clients", "1",
                              "4", "--requests", "2", "--prompt-tokens", "400", "--gen-tokens", "8", "--turns", "2",
                              "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        print("\n" + run.stdout)
        assert "TTFT p50/p95/p99 ms" in run.stdout
        result = json.loads(out.read_text())
        assert [r["clients"] for r in result["rows"]] == [1, 4]
        for row in result["rows"]:
            assert row["requests"] == 2 * 2 * row["clients"]
            assert row["prompt_tokens"] > 300 and row["aggregate_tok_s"] > 0 and row["ttft_ms_p50"] > 0
            assert row["ttft_ms_p50"] <= row["ttft_ms_p95"] <= row["ttft_ms_p99"]
            assert row["acceptance_length"] is None  # the CPU engine does not speculate
        solo = result["rows"][0]
        assert solo["turn2_ttft_ms_p50"] < solo["ttft_ms_p50"]  # the second turn resumes from the first's state
    finally:
        proc.terminate()
        proc.communicate(timeout=30)

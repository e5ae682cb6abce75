"""The README's headline figures are rendered from docs/bench/*.json (lucegen/devtools/readme_figures.py): the
committed README matches what the committed results give, a small result set renders into the expected rows, and a
result the table cannot be rendered from is refused in one line naming the file and the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lucegen.devtools import readme_figures
from lucegen.devtools.readme_figures import FiguresError, check, render

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCH_DIR = ROOT / "docs" / "bench"

STAMP = {"commit": "abc1234", "machine": "NVIDIA H100 80GB HBM3", "date": "2026-11-30"}
DECODE = {"bench": "decode", "label": "Qwen3.5-0.8B BF16", **STAMP, "device": "NVIDIA H100 80GB HBM3",
          "gen_tokens": 128, "prompt_tokens": 32, "repeats": 10, "tok_s": 1501.4, "tok_s_best": 1512.2,
          "whole_lm_head": {"tok_s": 1330.2}, "sampled": {"temperature": 0.8, "tok_s": 1402.7}}
PREFILL = {"bench": "prefill", "label": None, "model": "custom", **STAMP,
           "rows": [{"tokens": 520, "tok_s": 100466.3}, {"tokens": 4096, "tok_s": 143119.0}]}
DFLASH = {"bench": "dflash", "label": "27B Q4_K_M", **STAMP, "ar": "megakernel", "ar_ms_per_token": 6.9930,
          "ar_tok_s": 143.0, "verify": [{"budget": 1, "ms": 7.0}, {"budget": 22, "ms": 11.86}],
          "spec": [{"al": 4.0, "tok_s": 400.0, "vs_ar": 2.8}, {"al": 8.0, "tok_s": 672.7, "vs_ar": 4.7}],
          "projection": {"al": 8.31, "budget": 22, "tok_s": 595.2, "vs_ar": 4.18, "from_al_row": 8.0}}


def write(directory: Path, **results: dict) -> Path:
    directory.mkdir(exist_ok=True)
    for name, result in results.items():
        (directory / f"{name}.json").write_text(json.dumps(result))
    return directory


def table_rows(block: str) -> list[list[str]]:
    rows = [line.strip("|").split(" | ") for line in block.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # the header row left out


def test_the_committed_readme_shows_what_docs_bench_gives():
    stale = check(README, BENCH_DIR)
    assert stale is None, stale


def test_readme_stays_within_300_lines():
    assert len(README.read_text().splitlines()) <= 300


def test_every_committed_result_carries_its_provenance():
    results = sorted(BENCH_DIR.glob("*.json"))
    assert results, "docs/bench/ holds no bench results"
    for path in results:
        result = json.loads(path.read_text())
        for name in ("bench", "commit", "machine", "date"):
            assert result.get(name), f"{path.name}: no {name}"


def test_a_small_result_set_renders_into_the_expected_rows(tmp_path):
    # file names out of headline order: the rows still come decode, prefill, dflash
    bench = write(tmp_path / "bench", a_dflash=DFLASH, b_prefill=PREFILL, c_decode=DECODE)
    block = render(bench)
    stamp = ["abc1234", "NVIDIA H100 80GB HBM3", "2026-11-30"]
    expected = [
        ["Qwen3.5-0.8B BF16 decode tg128, greedy (median of 10)", "**1,501 tok/s** (best 1,512)", *stamp,
         "[json](docs/bench/c_decode.json)"],
        ["Qwen3.5-0.8B BF16 decode tg128, lm_head read whole", "1,330 tok/s", *stamp,
         "[json](docs/bench/c_decode.json)"],
        ["Qwen3.5-0.8B BF16 decode tg128, sampled at temperature 0.8", "1,403 tok/s", *stamp,
         "[json](docs/bench/c_decode.json)"],
        ["custom prefill pp520", "**100,466 tok/s**", *stamp, "[json](docs/bench/b_prefill.json)"],
        ["custom prefill pp4096", "**143,119 tok/s**", *stamp, "[json](docs/bench/b_prefill.json)"],
        ["27B Q4_K_M AR decode (megakernel)", "**143.0 tok/s** (6.993 ms/token)", *stamp,
         "[json](docs/bench/a_dflash.json)"],
        ["27B Q4_K_M tree verify, budget 1 / 22", "7.000 / 11.860 ms", *stamp, "[json](docs/bench/a_dflash.json)"],
        ["27B Q4_K_M speculative, projected at acceptance length 8.31 (budget 22)",
         "~595 tok/s projected (4.18× AR)", *stamp, "[json](docs/bench/a_dflash.json)"],
        ["27B Q4_K_M speculative, oracle-held acceptance length 8.00", "672.7 tok/s (4.70× AR)", *stamp,
         "[json](docs/bench/a_dflash.json)"],
    ]
    assert table_rows(block) == expected
    assert block.startswith(readme_figures.BEGIN) and block.endswith(readme_figures.END)
    assert "Not yet written by the bench" not in block and "docs/benchmarks.md" in block
    write(bench, c_decode={**DECODE, "source": "transcribed from somewhere"})
    assert "Not yet written by the bench itself: c_decode.json, transcribed from somewhere." in render(bench)


@pytest.mark.parametrize("result, named", [
    ({k: v for k, v in DECODE.items() if k != "tok_s_best"}, "'tok_s_best'"),
    ({**DECODE, "sampled": {"temperature": 0.8}}, "'sampled.tok_s'"),
    ({**PREFILL, "rows": [{"tokens": 520}]}, "'rows[0].tok_s'"),
    ({k: v for k, v in DFLASH.items() if k != "commit"}, "'commit'"),
    ({**DFLASH, "ar_tok_s": "fast"}, "'ar_tok_s' is 'fast', not a number"),
    ({**PREFILL, "model": None}, "'label'"),
    ({**PREFILL, "rows": {"tokens": 520}}, "'rows' is {'tokens': 520}, not a non-empty list"),
    ({**DFLASH, "verify": []}, "'verify' is [], not a non-empty list"),
    ({**DFLASH, "projection": {"al": 8.31, "budget": 22, "vs_ar": 4.18}}, "'projection.tok_s'"),
])
def test_a_result_missing_a_needed_field_is_refused_naming_file_and_field(tmp_path, result, named):
    bench = write(tmp_path / "bench", good=PREFILL | {"label": "other"}, bad=result)
    with pytest.raises(FiguresError) as err:
        render(bench)
    message = str(err.value)
    assert "\n" not in message and str(bench / "bad.json") in message and named in message


def test_unusable_directories_and_files_are_refused(tmp_path):
    with pytest.raises(FiguresError, match="no bench results"):
        render(tmp_path)
    write(tmp_path / "two", one=DECODE, other=DECODE)
    with pytest.raises(FiguresError, match="two decode results of 'Qwen3.5-0.8B BF16'.*keep the latest only"):
        render(tmp_path / "two")
    write(tmp_path / "serve", s={"bench": "serve", **STAMP, "rows": []})
    with pytest.raises(FiguresError, match=r"s\.json: field 'bench' is 'serve'"):
        render(tmp_path / "serve")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "x.json").write_text("[1, 2]")
    with pytest.raises(FiguresError, match=r"x\.json: expected a JSON object, got list"):
        render(tmp_path / "list")


def test_check_and_rewrite_through_the_command_line(tmp_path):
    """--check exits 1 with one line while the block is stale; a rewrite makes it pass and leaves the rest alone."""
    bench = write(tmp_path / "bench", decode=DECODE)
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\nbefore\n<!-- figures:begin -->\n| old | row |\n<!-- figures:end -->\nafter\n")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lucegen.devtools.readme_figures", "--readme", str(readme),
                               "--bench-dir", str(bench), *args], cwd=ROOT, capture_output=True, text=True)

    stale = run("--check")
    assert stale.returncode == 1 and stale.stderr.count("\n") == 1 and "readme_figures" in stale.stderr
    assert run().returncode == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n" + readme_figures.BEGIN) and text.endswith(
        readme_figures.END + "\nafter\n")
    assert "| old | row |" not in text and "**1,501 tok/s** (best 1,512)" in text
    assert run("--check").returncode == 0 and check(readme, bench) is None
    write(bench, decode={**DECODE, "tok_s": 1600.0})
    assert "differ" in check(readme, bench)
    readme.write_text("no markers here\n")
    broken = run("--check")
    assert broken.returncode == 2 and "expected one '<!-- figures:begin" in broken.stderr

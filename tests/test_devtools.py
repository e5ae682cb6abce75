"""lucegen.devtools on the CPU: the SASS comparison on tiny kernels compiled by NVRTC here, the launch census on the
host device, and each GPU tool's argument parsing and the checks it makes before it touches a device."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import lucegen
from lucegen.bench.decode import phase_names
from lucegen.compile import compile_source
from lucegen.devtools import (attention_bench, draft_profile, launch_census, megakernel_timeline, prefill_profile,
                              quant_gemm_bench, sass_diff, target_profile)
from lucegen.target import load_target

# ---- sass_diff --------------------------------------------------------------------------------------------------
OLD = r"""
extern "C" __global__ void kept(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" __global__ void changed(float* x) { x[threadIdx.x] *= 2.0f; }
extern "C" __global__ void retired(float* x) { x[threadIdx.x] = 0.0f; }
extern "C" __global__ void looped(float* x, int n) { for (int i = 0; i < n; ++i) x[i] += x[i + 1]; }
"""
NEW = r"""
extern "C" __global__ void kept(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" __global__ void changed(float* x) { x[threadIdx.x] = x[threadIdx.x] * x[threadIdx.x + 7] + x[3]; }
extern "C" __global__ void looped(float* x, int n) { for (int i = 0; i < n; ++i) x[i] += x[i + 1]; }
extern "C" __global__ void added(float* x) { x[0] = 1.0f; }
"""


def test_sass_diff_names_the_kernels_two_sources_differ_in(tmp_path):
    try:
        cuobjdump = sass_diff.find_cuobjdump(None)
    except SystemExit:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm: lucegen's dev extra)")
    target = load_target("sm_90")
    sass = {}
    for side, source in (("old", OLD), ("new", NEW)):
        cubin = tmp_path / f"{side}.cubin"
        cubin.write_bytes(compile_source(target, f"sass_{side}", source, use_cache=False).binary)
        sass[side] = {"tiny": sass_diff.kernels_sass(cuobjdump, str(cubin))}
    assert {"kept", "changed", "retired", "looped"} == set(sass["old"]["tiny"])
    assert sass["old"]["tiny"]["kept"] and all(";" not in i for i in sass["old"]["tiny"]["kept"])
    lines, differs = sass_diff.compare(sass["old"], sass["new"], ["tiny"])
    assert differs
    assert lines[0] == "tiny: 3 kernels in both, 1 differ"
    assert re.fullmatch(r"  differs  changed: \d+ -> \d+ instructions", lines[1])
    assert lines[2:] == ["  old only retired", "  new only added"]
    assert sass_diff.compare(sass["old"], sass["old"], ["tiny"]) == (["tiny: 4 kernels in both, 0 differ"], False)


@pytest.mark.slow
def test_sass_diff_compares_two_source_trees(tmp_path, capsys):
    """Two trees, the new one with a scale in rmsnorm: each compiled in a process of its own, only rmsnorm moves."""
    try:
        sass_diff.find_cuobjdump(None)
    except SystemExit:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm: lucegen's dev extra)")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "lucegen").symlink_to(lucegen.PACKAGE_DIR)
    new = tmp_path / "new" / "lucegen"
    shutil.copytree(lucegen.PACKAGE_DIR, new, ignore=shutil.ignore_patterns("__pycache__"))
    template = new / "templates" / "kernels" / "small_kernels.cu.j2"
    line = "  const float scale = rsqrtf(block_sum(sum_sq, scratch) / (float)n + eps);"
    assert line in template.read_text()
    template.write_text(template.read_text().replace(line, line[:-1] + " * 1.5f;"))
    argv = [str(tmp_path / "old"), str(tmp_path / "new"), "--target", "sm_86", "--families", "small_kernels"]
    assert sass_diff.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("sm_86: old nvrtc ")
    assert re.fullmatch(r"small_kernels: \d+ kernels in both, 2 differ", out[1])
    assert [line.split()[1] for line in out[2:]] == ["rmsnorm_bf16:", "rmsnorm_fp16:"]
    assert sass_diff.main([str(tmp_path / "old"), str(tmp_path / "old")] + argv[2:]) == 0


def test_sass_diff_ignores_addresses_and_branch_targets():
    def listing(target: str, extra: str = "") -> str:
        return (f"\t\tFunction : k\n"
                f"        /*0000*/                   MOV R1, c[0x0][0x28] ;   /* 0x00000a0000017a02 */\n"
                f"        /*0010*/                   BRA {target} ;   /* 0x000fc0000383ffff */\n"
                f"        /*0020*/                   {extra or 'EXIT'} ;   /* 0x000000000000794d */\n")

    a, b = sass_diff.parse_sass(listing("0x10")), sass_diff.parse_sass(listing("0x90"))
    assert a == b == {"k": ["MOV R1, c[0x0][0x28]", "BRA X", "EXIT"]}
    assert sass_diff.parse_sass(listing("0x10", "NOP")) != a


def test_sass_diff_arguments():
    args = sass_diff.build_parser().parse_args(["old", "new", "--quantised", "--families", "quant_gemm", "tree_verify"])
    assert (args.old, args.new, args.target, args.quantised) == ("old", "new", "sm_90", True)
    assert args.families == ["quant_gemm", "tree_verify"] and args.nvrtc_lib is None
    with pytest.raises(SystemExit) as exit:
        sass_diff.build_parser().parse_args(["only_one"])
    assert exit.value.code == 2


# ---- launch_census: runs on the host device ------------------------------------------------------------------------
@pytest.mark.slow
def test_launch_census_of_a_tiny_quantised_target(tmp_path, capsys):
    from lucegen.model.config import ModelConfig
    from lucegen.model.init_gguf import write_gguf_checkpoint

    gguf = tmp_path / "tiny-q.gguf"
    write_gguf_checkpoint(ModelConfig.preset("tiny-q"), gguf, quant="q4_k_m", seed=0, progress=False)
    assert launch_census.main([str(gguf), "--slots", "2", "--target", "sm_90"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = re.fullmatch(rf"{re.escape(str(gguf))}: one verify pass of 2 slot\(s\) on sm_90 \(132 SMs\): "
                        r"(\d+) launches, [\d.]+ GB of GEMM weights", out[0])
    assert head, out[0]
    rows = {line.split()[0] + (" " + line.split()[1] if line.split()[1].startswith("x") else ""): line.split()
            for line in out[2:-1]}
    gemms = [name for name in rows if re.fullmatch(r"quant_gemm_\w+ x\d+", name)]
    assert gemms and "quant_gemm_amax" in rows  # the magnitude kernel counted by name, not as a GEMM
    assert sum(int(r[-6]) for r in rows.values()) == int(head.group(1))  # every launch in one row
    assert out[-1].startswith("if every wave of a GEMM took as long as a full one:")
    with pytest.raises(SystemExit):
        launch_census.main([str(gguf), "--slots", "0"])


# ---- the GPU tools: arguments and the checks before the device ------------------------------------------------------
def test_quant_gemm_bench_shapes_and_flags():
    cli = quant_gemm_bench.build_parser()
    args = cli.parse_args(["1", "23", "--parts", "1,2", "--int8", "0,1", "--shape", "lm_head"])
    assert args.rows == [1, 23] and args.parts == (1, 2) and args.int8 == (0, 1) and args.ring == (None,)
    assert list(quant_gemm_bench.selected_shapes(args, cli)) == ["lm_head (Q6_K)"]
    args = cli.parse_args(["--tiles", "66,132"])
    shapes = quant_gemm_bench.selected_shapes(args, cli)
    assert shapes["Q4_K 1056 x 5120 (66 tiles)"] == ([("Q4_K", 1056)], 5120, "rows_f32")
    assert shapes["Q4_K 2112 x 17408 (132 tiles)"] == ([("Q4_K", 2112)], 17408, "residual") and len(shapes) == 4
    assert len(quant_gemm_bench.selected_shapes(cli.parse_args([]), cli)) == len(quant_gemm_bench.SHAPES)
    with pytest.raises(SystemExit):
        quant_gemm_bench.selected_shapes(cli.parse_args(["--shape", "no such"]), cli)
    with pytest.raises(SystemExit):
        cli.parse_args(["--parts", "1,x"])


def test_attention_bench_arguments():
    args = attention_bench.build_parser().parse_args(["--contexts", "64,4096", "--kv", "q4_0,fp16", "--bodies",
                                                      "fma,mma"])
    assert args.contexts == [64, 4096] and args.slots == [1, 23] and args.kv == ["q4_0", "fp16"]
    assert args.bodies == ["fma", "mma"]
    for bad in (["--kv", "q5_9"], ["--bodies", "tensor"], ["--slots", "0,1"]):
        with pytest.raises(SystemExit):
            attention_bench.build_parser().parse_args(bad)


@pytest.mark.parametrize("tool, argv", [
    (target_profile, ["model.gguf", "--steps", "0"]),
    (target_profile, ["model.gguf", "--slots", "0"]),
    (draft_profile, ["model.gguf", "draft", "--repeats", "0"]),
    (prefill_profile, ["model", "520", "0"]),
    (megakernel_timeline, ["model"]),
    (megakernel_timeline, ["model", "out", "--load", "t.npz"]),
])
def test_profilers_refuse_bad_arguments_before_the_device(tool, argv, capsys):
    with pytest.raises(SystemExit) as exit:
        tool.main(argv)
    assert exit.value.code == 2 and "error:" in capsys.readouterr().err


def test_profiler_arguments():
    args = target_profile.build_parser().parse_args(["m.gguf", "--slots", "2", "--timeline", "--budget", "64"])
    assert (args.slots, args.budget, args.timeline, args.steps, args.tensor_core_keys) == (2, 64, True, 8, None)
    assert prefill_profile.build_parser().parse_args(["m"]).tokens == [520]
    assert draft_profile.build_parser().parse_args(["m", "d"]).repeats == 20


def test_megakernel_timeline_reports_a_saved_timeline(tmp_path, capsys):
    kinds = np.array([0, 1])
    phases, blocks, steps = len(phase_names(list(kinds))), 4, 20
    stamps = np.zeros((steps, phases, blocks, 4), np.int64)
    for p in range(phases):  # each phase's last block ends 1 us after the previous phase's
        base = p * 1000
        stamps[:, p, :, 0] = base - 900 + np.arange(blocks)
        stamps[:, p, :, 1] = base - 700
        stamps[:, p, :, 2] = base - 500
        stamps[:, p, :, 3] = base - (blocks - 1) + np.arange(blocks)
    np.savez_compressed(tmp_path / "timeline.npz", stamps=stamps, kinds=kinds)
    assert megakernel_timeline.main(["--load", str(tmp_path / "timeline.npz")]) == 0
    out = capsys.readouterr().out
    assert f"critical path per token (phases 1..): {phases - 1:.1f} µs" in out
    attention = next(line for line in out.splitlines() if line.startswith("attention "))
    assert "(not stamped)" in attention and attention.split()[1:3] == ["1", "1.00"]
    gate_up = next(line for line in out.splitlines() if line.startswith("mlp_gate_up "))
    assert gate_up.split()[1:3] == ["2", "1.00"] and "0.30  0.30  0.30" in gate_up  # inputs 0.3 us after t0

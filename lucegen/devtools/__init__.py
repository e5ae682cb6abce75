"""Tools for lucegen's contributors, one module each, run as ``python -m lucegen.devtools.<tool> --help``:

- ``sass_diff``: which kernels' machine code a change moves (two source trees, one NVRTC, SASS compared); CPU.
- ``launch_census``: every launch of one verify pass on the host device, with its grid's waves and last-wave fill;
  CPU, needs a quantised GGUF.
- ``quant_gemm_bench``: the quantised GEMM timed on the 27B's matrix shapes (GPU).
- ``attention_bench``: the verify pass's tree attention timed over context and slot count (GPU).
- ``target_profile``: where the quantised target's decode step and verify pass go, per kernel (GPU, torch).
- ``draft_profile``: where a DFlash draft step goes, per kernel (GPU, torch).
- ``prefill_profile``: where one graph-launched prefill goes, per kernel (GPU, torch).
- ``megakernel_timeline``: when each decode-megakernel phase's blocks start, get their inputs and finish (GPU; a
  saved timeline reports anywhere).
- ``readme_figures``: the README's headline figures rendered from the bench results in docs/bench/ (``--check``:
  exit 1 when stale); CPU.

Each module is also a script: to run today's tool against an older tree (an A/B pair in one device call), run the
file with that tree first on the path, from outside any tree (``-m`` puts the current directory first):
``PYTHONPATH=/tmp/old python /path/to/lucegen/devtools/quant_gemm_bench.py 23``.

One-off probes that served a single experiment are in experiments/ at the repository root.
"""

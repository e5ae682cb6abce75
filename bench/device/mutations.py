#!/usr/bin/env python3
"""Do the GPU tests catch a wrong constant in the kernel arithmetic that only they check?

docs/design.md ("What the CPU tests cannot check") lists the kernel arithmetic that only tests/gpu checks. Each
mutation below changes one constant of one template under lucegen/templates (a shift, a scale, a mask, a sign, an
offset: a plausible bug that still compiles) and names the narrowest GPU tests whose assertions cover it. On the
GPU machine, from the repo root (PYTHONPATH and the compile cache as the caller sets them; the cache is keyed by
the source, so mutated kernels compile under keys of their own):

    python3 bench/device/mutations.py [--only NAME[,NAME]] [--budget SECONDS]

runs every selection unmutated first (all must pass), then per mutation edits the template in place, runs the
selection with pytest and restores the file (also on SIGTERM / Ctrl-C; checked byte for byte at the end). Results:
caught (the tests failed), NOT CAUGHT (they passed: a gap), bad mutation (it did not render or compile), error
(pytest could not collect or run), skipped (no test ran), timeout, not run (budget). A table is printed and, where
$OUT is set, written to $OUT/mutations.json.

    python3 bench/device/mutations.py --dry-run [--compile]

checks on a CPU what it can: every `old` text occurs exactly once in its template, the mutated template renders
through lucegen.codegen for the h200 descriptor (and its quantised-target variant) and changes the rendered source
of its family; with --compile, each changed source also compiles with NVRTC (uncached). No test runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "lucegen" / "templates"
GPU = "tests/gpu/"


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    template: str  # under lucegen/templates
    old: str  # occurs exactly once in the template
    new: str
    what: str  # the bug it plants
    tests: tuple[str, ...]  # pytest node ids or files under tests/gpu
    family: str  # the kernel family whose rendered source the template is part of (--dry-run)
    k: str | None = None  # pytest -k expression
    # () -> template parameters over the family's (a dict merges into the family's dict of that name), where the
    # tests load another instance of the family than `lucegen build` renders (--dry-run)
    instance: Callable[[], dict] | None = None


def kv_cache_instance(kv: str) -> dict:
    """The prefill families' parameters for the KV cache format ``kv`` (lucegen/model/kv_cache.py)."""
    from lucegen.model import kv_cache

    return {"pf": kv_cache.kv_format(kv).template_params()}


MUTATIONS = (
    Mutation("mk_rmsnorm_1p", "megakernel/decode.cu.j2",
             "raw[i] * r * (1.f + w[i]);", "raw[i] * r * w[i];",
             "stage_rmsnorm scales by w instead of Qwen3.5's (1 + w)",
             (GPU + "test_megakernel.py",), "megakernel", k="teacher_forced_logits_and_state"),
    Mutation("mk_fp16_unpack", "megakernel/primitives.cuh.j2",
             "cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;", "cvt.f32.f16 %0, h; cvt.f32.f16 %1, l;",
             "fp16 weight pairs unpack swapped (a probe: the h200's megakernel is bf16 throughout)",
             (GPU + "test_megakernel.py",), "megakernel", k="teacher_forced_logits_and_state"),
    Mutation("mk_deltanet_decay", "megakernel/deltanet.cuh.j2",
             "decay = mk_exp(in[2 * KPL])", "decay = mk_exp(0.5f * in[2 * KPL])",
             "the delta rule's state decay exp(g) becomes exp(g / 2)",
             (GPU + "test_megakernel.py",), "megakernel", k="teacher_forced_logits_and_state"),
    Mutation("mk_rope_sign", "megakernel/attention.cuh.j2",
             "const float qp = t < half ? -q[t + half] : q[t - half];",
             "const float qp = t < half ? q[t + half] : q[t - half];",
             "rotate_half of q loses its minus sign (k keeps it)",
             (GPU + "test_megakernel.py",), "megakernel", k="teacher_forced_logits_and_state"),
    Mutation("mk_split_softmax_base", "common/split_softmax.cuh.j2",
             ": expf(m(p) - mmax);", ": exp2f(m(p) - mmax);",
             "partial softmaxes (base e) merge with base-2 corrections",
             (GPU + "test_megakernel.py::test_attention_keys_split_over_blocks",), "megakernel"),
    Mutation("mk_argmax_key_order", "megakernel/mlp_lm_head.cuh.j2",
             "u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);", "u = (u & 0x80000000u) ? u : (u | 0x80000000u);",
             "argmax keys order negative logits by magnitude, above the positive ones",
             (GPU + "test_megakernel.py::test_screened_lm_head_picks_the_whole_lm_heads_token",), "megakernel"),
    Mutation("mk_screen_code_bias", "megakernel/decode.cu.j2",
             "mk_byte_over_2p23(w, k) - 8388640.f;", "mk_byte_over_2p23(w, k) - 8388608.f;",
             "the lm_head screen's 6-bit codes keep their +32 bias",
             (GPU + "test_megakernel.py::test_screened_lm_head_picks_the_whole_lm_heads_token",), "megakernel"),
    Mutation("mk_sample_step", "megakernel/mlp_lm_head.cuh.j2",
             "(unsigned long long)a.start_pos + step + 1,", "(unsigned long long)a.start_pos + step,",
             "the sampled draw takes the Gumbel noise of the step before",
             (GPU + "test_sampling_gpu.py::test_megakernel_sampled_steps_draw_from_their_own_logits",),
             "megakernel", instance=lambda: {"mk": {"sampling": True, "lm_screen": False}}),
    Mutation("qmv_q6k_offset", "kernels/quant_matvec.cu.j2",
             "(float)((low | (high << 4)) - 32)", "(float)((low | (high << 4)) - 31)",
             "Q6_K values q - 31 instead of q - 32",
             (GPU + "test_quant_matvec.py::test_dequantize_bit_exact",), "quant_matvec"),
    Mutation("qg_k_min_high_bits", "kernels/quant_gemm/fragments.cuh.j2",
             "k.m[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);",
             "k.m[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 1) & 0x30303030u);",
             "Q4_K / Q5_K mins of sub-blocks 4..7 take the wrong top bits",
             (GPU + "test_quant_gemm.py::test_int8_groups_match_numpy_and_rows_alone[9]",), "quant_gemm"),
    Mutation("qg_q8_inv_rounding", "common/q8_activations.cuh.j2",
             "__float2half_rz(amax > 0.0f", "__float2half_rn(amax > 0.0f",
             "the int8 quantiser's 127 / amax rounds to nearest instead of toward zero",
             (GPU + "test_quant_gemm.py::test_int8_rounding_matches_numpy_bit_for_bit",), "quant_gemm"),
    Mutation("pf_attention_scale", "prefill/attention.cu.j2",
             "({{ pf.attn_scale }}f * 1.4426950408889634f)", "({{ pf.attn_scale }}f * 0.6931471805599453f)",
             "the base-2 softmax scale multiplies by ln 2 instead of log2 e",
             (GPU + "test_prefill_attention.py::test_attention_tiny",), "prefill_attention"),
    Mutation("kv_q4_0_decode", "common/kv_cache.cuh.j2",
             "& 15u) - 8) * d;", "& 15u) - 7) * d;",
             "q4_0 KV cache codes decode as code - 7 instead of code - 8",
             (GPU + "test_prefill_attention.py::test_attention_quantised_cache",), "prefill_attention",
             k="q4_0 and tiny-gqa", instance=lambda: kv_cache_instance("q4_0")),
    Mutation("kv_q4_0_rounding", "common/kv_cache.cuh.j2",
             "truncf(lg_add_rn(lg_mul_rn(x, inv), 8.5f))", "truncf(lg_add_rn(lg_mul_rn(x, inv), 8.0f))",
             "the q4_0 KV cache quantiser truncates x / d instead of rounding it",
             (GPU + "test_prefill_attention.py::test_attention_quantised_cache",), "prefill_attention",
             k="q4_0 and tiny-gqa", instance=lambda: kv_cache_instance("q4_0")),
    Mutation("pf_deltanet_chunk_mask", "prefill/deltanet.cu.j2",
             "const float decay = j <= i ? expf(gc_s[i] - gc_s[j]) : 0.0f;",
             "const float decay = j < i ? expf(gc_s[i] - gc_s[j]) : 0.0f;",
             "the chunk's decay mask drops its diagonal: P = (q k^T) decay loses each token's own term",
             (GPU + "test_prefill_deltanet.py::test_deltanet_tiny",), "prefill_deltanet"),
    Mutation("pf_gemm_swiglu_sign", "prefill/gemm.cu.j2",
             "gate / (1.0f + __expf(-gate)) * up", "gate / (1.0f + __expf(gate)) * up",
             "the SwiGLU epilogue's sigmoid loses its minus sign",
             (GPU + "test_prefill_gemm.py::test_gemm_swiglu",), "prefill_gemm_swiglu"),
    Mutation("tv_tree_keys", "dflash/tree_verify.cu.j2",
             "const int pos0 = *pos0_at, n_keys = pos0 + depth[s] + 1;",
             "const int pos0 = *pos0_at, n_keys = pos0 + depth[s];",
             "a verify slot's attention (FMA body) misses its own key",
             (GPU + "test_tree_verify.py::test_every_slot_matches_its_path",), "tree_verify"),
    Mutation("rows_best_ties", "dflash/rows_best.cuh.j2",
             "(ov == bv && oi < bi)", "(ov == bv && oi > bi)",
             "rows_argmax / rows_sample keep the highest index among equal maxima",
             (GPU + "test_tree_verify.py::test_rows_argmax_takes_the_first_of_equal_maxima",), "tree_verify"),
    Mutation("rows_sample_step", "dflash/rows_sample.cu.j2",
             "(unsigned long long)pos0[0] + 1;", "(unsigned long long)pos0[0];",
             "rows_sample draws with the Gumbel noise of the position before",
             (GPU + "test_sampling_gpu.py::test_rows_sample_draws_the_reference_token",), "rows_sample"),
    Mutation("draft_rope_sign", "dflash/draft.cu.j2",
             "(low ? -partner : partner) * sn;", "(low ? partner : -partner) * sn;",
             "the draft's rotate_half swaps its signs",
             (GPU + "test_dflash_draft.py::test_draft_after_prefill_matches_reference[tiny]",), "dflash_draft"),
)


def mutated_text(m: Mutation, text: str) -> str:
    """The template text with the mutation applied; the `old` text must occur exactly once."""
    count = text.count(m.old)
    if count != 1:
        raise SystemExit(f"mutation {m.name}: its old text occurs {count} times in lucegen/templates/{m.template}, "
                         f"not once: {m.old!r}")
    return text.replace(m.old, m.new)


class Interrupted(Exception):
    """SIGTERM: leave through the finally blocks, which restore the templates."""


def _on_sigterm(signum, frame):
    raise Interrupted()


@contextlib.contextmanager
def mutated(m: Mutation):
    """The template of ``m`` mutated on disk for the block's duration; the original bytes always come back."""
    path = TEMPLATES / m.template
    original = path.read_bytes()
    new = mutated_text(m, original.decode()).encode()
    try:
        path.write_bytes(new)
        yield
    finally:
        path.write_bytes(original)


def _selection(m: Mutation) -> list[str]:
    return [*m.tests, *(["-k", m.k] if m.k else [])]


# pytest with Hypothesis's shrink phase off: the first failing example decides, and shrinking a GPU test's failure
# would run it many more times (the tests' own settings() inherit the profile loaded before they are imported).
PYTEST_NO_SHRINK = """import sys, hypothesis, pytest
P = hypothesis.Phase
hypothesis.settings.register_profile("no_shrink", phases=[P.explicit, P.reuse, P.generate, P.target])
hypothesis.settings.load_profile("no_shrink")
sys.exit(pytest.main(sys.argv[1:]))"""


def run_pytest(args: list[str], timeout: float) -> tuple[str, float, str]:
    """(outcome, seconds, output tail) of one pytest run of the selection ``args``; outcome: passed, failed,
    compile error (a CompileError / TemplateError in the output), error (collection, usage), skipped (no test ran),
    timeout."""
    cmd = [sys.executable, "-c", PYTEST_NO_SHRINK, "-q", "-x", "-p", "no:cacheprovider", "--tb=line",
           "-W", "ignore::pytest.PytestAssertRewriteWarning", *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1.0))
    except (subprocess.TimeoutExpired, KeyboardInterrupt, Interrupted) as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return "timeout", time.monotonic() - t0, out[-2000:]
    seconds = time.monotonic() - t0
    tail = out[-2000:]
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    if proc.returncode == 1 and re.search(r"\b(CompileError|TemplateError)\b", out):
        return "compile error", seconds, tail
    if proc.returncode == 1:
        return "failed", seconds, tail
    if proc.returncode == 0:
        return ("passed" if re.search(r"\d+ passed", summary) else "skipped"), seconds, tail
    return ("skipped" if proc.returncode == 5 else "error"), seconds, tail


#: a mutation's result by its pytest outcome (others keep the outcome's name)
RESULTS = {"failed": "caught", "passed": "NOT CAUGHT", "compile error": "bad mutation"}


def print_table(rows: list[dict]) -> None:
    cols = ("name", "template", "selection", "result", "seconds")
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.ljust(width[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).ljust(width[c]) for c in cols))


def _row(m: Mutation, result: str, seconds: float, **extra) -> dict:
    return {"name": m.name, "template": m.template, "what": m.what, "selection": " ".join(_selection(m)),
            "result": result, "seconds": round(seconds, 1), **extra}


def run_on_gpu(mutations: list[Mutation], budget: float) -> list[dict]:
    start = time.monotonic()
    left = lambda: budget - (time.monotonic() - start)  # noqa: E731
    control: dict[tuple, float] = {}
    rows = []
    for m in mutations:  # every selection unmutated: must pass (also compiles the unmutated kernels)
        key = tuple(_selection(m))
        if key in control:
            continue
        result, seconds, tail = run_pytest(list(key), left())
        print(f"control {' '.join(key)}: {result} ({seconds:.0f} s)", flush=True)
        rows.append({"name": "(control)", "template": "-", "selection": " ".join(key), "result": result,
                     "seconds": round(seconds, 1)})
        if result != "passed":
            print(tail)
            print(f"control run of {' '.join(key)}: {result}; no mutation runs", flush=True)
            rows[-1]["output"] = tail
            return rows
        control[key] = seconds
    for m in mutations:
        estimate = control[tuple(_selection(m))]  # its tests as the control ran them, compile included
        if left() < estimate:
            rows.append(_row(m, "not run", 0.0, note=f"budget: {left():.0f} s left, estimate {estimate:.0f} s"))
            continue
        with mutated(m):
            outcome, seconds, tail = run_pytest(_selection(m), left())
        result = RESULTS.get(outcome, outcome)
        print(f"{m.name}: {result} ({seconds:.0f} s)", flush=True)
        rows.append(_row(m, result, seconds, **({"output": tail} if result in ("bad mutation", "error") else {})))
    return rows


def dry_run(mutations: list[Mutation], compile_: bool) -> list[dict]:
    from lucegen import codegen
    from lucegen.compile import compile_source
    from lucegen.target import load_target

    descriptor = load_target("h200")
    targets = [descriptor] + ([descriptor.quantised_target()] if descriptor.quantised_target() is not descriptor
                              else [])

    def params(fam, t, shape, instance) -> dict:
        p = fam.params(t, fam.shape(shape))
        for key, value in (instance() if instance else {}).items():
            p[key] = {**p[key], **value} if isinstance(value, dict) else value
        return p

    def sources(m: Mutation) -> dict[tuple, str]:
        codegen.environment.cache_clear()  # Jinja reads the template files afresh
        fam = codegen.family(m.family)
        return {(t.variant or t.name, shape or "-"):
                codegen.render_family(t, fam, params=params(fam, t, shape, m.instance))
                for t in targets for shape in codegen.shapes(t, fam)}

    rows = []
    for m in mutations:
        t0 = time.monotonic()
        before = sources(m)
        try:
            with mutated(m):
                after = sources(m)
        except Exception as exc:  # noqa: BLE001: a template that no longer renders is this mutation's result
            rows.append(_row(m, "bad mutation", time.monotonic() - t0, output=f"render: {exc}"))
            continue
        changed = [key for key in before if after[key] != before[key]]
        result = "renders, changes " + ", ".join(f"{v}/{s}" for v, s in changed) if changed else "NO CHANGE"
        note = ""
        if changed and compile_:
            fam = codegen.family(m.family)
            for variant, shape in changed:
                t = next(t for t in targets if (t.variant or t.name) == variant)
                try:
                    compile_source(t, fam.name, after[(variant, shape)], template=fam.template,
                                   options=tuple(fam.options(t)), arch=fam.arch(t), use_cache=False)
                except Exception as exc:  # noqa: BLE001
                    result, note = "bad mutation", f"compile {variant}/{shape}: {str(exc)[:1500]}"
                    break
            else:
                result += "; compiles"
        rows.append(_row(m, result, time.monotonic() - t0, **({"output": note} if note else {})))
        print(f"{m.name}: {result} ({time.monotonic() - t0:.1f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds: no mutation starts whose estimated run exceeds what is left (default 540)")
    parser.add_argument("--dry-run", action="store_true", help="CPU checks only: the texts, render and change")
    parser.add_argument("--compile", action="store_true", help="with --dry-run: NVRTC-compile each mutated source")
    args = parser.parse_args(argv)
    mutations = list(MUTATIONS)
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {m.name for m in MUTATIONS})
        if unknown:
            parser.error(f"--only: no mutation {', '.join(unknown)} (known: {', '.join(m.name for m in MUTATIONS)})")
        mutations = [m for m in MUTATIONS if m.name in names]
    for m in mutations:  # every old text once, before anything runs
        mutated_text(m, (TEMPLATES / m.template).read_text())
    originals = {p: p.read_bytes() for p in {TEMPLATES / m.template for m in mutations}}
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        rows = dry_run(mutations, args.compile) if args.dry_run else run_on_gpu(mutations, args.budget)
    except (Interrupted, KeyboardInterrupt):
        print("interrupted: no table", flush=True)
        return 130
    finally:
        altered = [str(p.relative_to(ROOT)) for p, b in originals.items() if p.read_bytes() != b]
        for p, b in originals.items():
            p.write_bytes(b)
        print(f"templates restored: {'ok' if not altered else 'REWRITTEN ' + ', '.join(altered)}", flush=True)
    print_table(rows)
    failed_control = any(r["name"] == "(control)" and r["result"] != "passed" for r in rows)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / ("mutations_dry_run.json" if args.dry_run else "mutations.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {out}")
    return 1 if failed_control else 0


if __name__ == "__main__":
    sys.exit(main())

"""``lucegen bench decode|prefill --model DIR``: decode is the megakernel's speed (tg-N after a P-token prompt),
achieved bandwidth against the descriptor, tok/J from NVML, barriers per token, optional per-phase profile; prefill is
ppN through the generated prefill kernels (tok/s, TFLOP/s against the descriptor's peak, time to first token) with each
GEMM shape against cuBLAS. Both measure the HF transformers baseline in the same run, print a table, and write the
numbers with ``--json``. dflash is speculative decoding, acceptance-controlled (lucegen/bench/dflash.py): verify cost
against the tree budget and spec tok/s against the acceptance length, both against AR decode measured in the same
run. serve is N concurrent streaming clients against a running ``lucegen serve`` (lucegen/bench/serve.py).

Every JSON file is headed by the bench, the ``--label`` given, the commit, the machine and the UTC date
(lucegen/bench/provenance.py); docs/bench/ keeps the latest per workload and machine, which the README's figures are
rendered from (lucegen/devtools/readme_figures.py).

A baseline that cannot run (no torch, no CUDA for torch, a model transformers cannot load) does not lose the
measurement: its row says why, and ``--json`` is written all the same (``--json -``: to stdout, the table then
goes to stderr)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from ..atomic import atomic_write
from ..bench.provenance import provenance
from ..errors import LucegenError
from . import check_draft_ring
from ..model.kv_cache import FORMATS as KV_FORMATS

log = logging.getLogger("lucegen")
JSON_HELP = ("write the results here ('-': stdout, and the table to stderr), headed by the bench, commit, machine "
             "and UTC date")
LABEL_HELP = "what was measured, in words, for the JSON and the README's table (e.g. 'Qwen3.5-0.8B BF16')"


def baseline(name: str, fn, *args, **kwargs) -> tuple[dict, str | None]:
    """``fn``'s result, or ({}, why) when the baseline cannot run: any failure of a baseline is reported, never
    fatal, since the lucegen measurement before it is done."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - whatever stops the baseline: torch missing, CUDA, HF loading
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        log.warning("the %s baseline did not run: %s", name, why)
        return {}, why


def table_stream(args):
    """Where the table goes: stderr when the JSON goes to stdout."""
    return sys.stderr if args.json is not None and str(args.json) == "-" else sys.stdout


def write_json(path: Path | None, result: dict, bench: str, label: str | None = None) -> None:
    """``result`` as JSON at ``path``, after the provenance fields (lucegen/bench/provenance.py); the machine is the
    result's device (none for ``bench serve``)."""
    if path is None:
        return
    text = json.dumps({**provenance(bench, result.get("device"), label), **result}, indent=2)
    if str(path) == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        atomic_write(path, text.encode())


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark decode, prefill or speculative decoding",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="bench_kind", required=True, metavar="KIND")
    d = sub.add_parser("decode", help="tg-N decode tok/s, GB/s, tok/J, HF baseline")
    d.add_argument("--model", required=True, type=Path, help="HF checkpoint directory")
    d.add_argument("--prompt-tokens", type=int, default=32)
    d.add_argument("--gen-tokens", type=int, default=128)
    d.add_argument("--repeats", type=int, default=10, help="timed launches (median reported)")
    d.add_argument("--target", default=None, help="descriptor (default: the one matching the GPU)")
    d.add_argument("--profile", action="store_true", help="also run the profiling build: time per phase type")
    d.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")
    d.add_argument("--json", type=Path, default=None, help=JSON_HELP)
    d.add_argument("--label", default=None, help=LABEL_HELP)
    d.set_defaults(func=run)
    f = sub.add_parser("prefill", help="ppN prefill tok/s, TFLOP/s, TTFT, GEMMs vs cuBLAS, HF baseline")
    f.add_argument("--model", required=True, type=Path,
                   help="HF checkpoint directory or .gguf file (a K-quant GGUF: the quantised target's prefill)")
    f.add_argument("--tokens", type=int, nargs="+", default=[520], help="prompt lengths (default 520)")
    f.add_argument("--repeats", type=int, default=10, help="timed prefills per length (median reported)")
    f.add_argument("--target", default=None, help="descriptor (default: the one matching the GPU)")
    f.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")
    f.add_argument("--hf-max-tokens", type=int, default=8192, help="longest prompt the HF baseline runs")
    f.add_argument("--no-gemm", action="store_true", help="skip the per-shape GEMM vs cuBLAS table")
    f.add_argument("--json", type=Path, default=None, help=JSON_HELP)
    f.add_argument("--label", default=None, help=LABEL_HELP)
    f.set_defaults(func=run_prefill)

    s = sub.add_parser("dflash", help="speculative decoding: verify cost vs budget, spec tok/s vs acceptance length")
    s.add_argument("--model", required=True, type=Path, help="the target: HF checkpoint directory or .gguf file "
                   "(a K-quant GGUF stays quantised on the device)")
    s.add_argument("--prompt-tokens", type=int, default=32)
    s.add_argument("--gen-tokens", type=int, default=128)
    s.add_argument("--repeats", type=int, default=10, help="timed passes per measurement (median reported)")
    s.add_argument("--budgets", type=int, nargs="+", default=None, help="tree budgets to time (default 0 1 8 16 22 "
                   "32 64)")
    s.add_argument("--draft", type=Path, default=None, help="DFlash draft (directory or .gguf): the network runs "
                   "every step (its cost counts) while the oracle's proposals set the acceptance")
    s.add_argument("--draft-top-k", type=int, default=8, dest="top_k", help="draft candidates per position (default 8)")
    s.add_argument("--draft-ring", type=int, default=None,
                   help="the draft's context ring: the last N positions (default: the whole context)")
    s.add_argument("--kv-cache", choices=tuple(KV_FORMATS), default=None,
                   help="the quantised target's KV cache format (default: the descriptor's kv_cache_type)")
    s.add_argument("--target", default=None, help="descriptor (default: the one matching the GPU)")
    s.add_argument("--json", type=Path, default=None, help=JSON_HELP)
    s.add_argument("--label", default=None, help=LABEL_HELP)
    s.set_defaults(func=run_dflash)

    v = sub.add_parser("serve", help="concurrent streaming clients against a running lucegen serve: TTFT, "
                       "inter-token latency, tok/s")
    v.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    v.add_argument("--model", default=None, help="model id to request (default: the server's first)")
    v.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16], help="concurrency levels "
                   "(default 1 4 8 16)")
    v.add_argument("--requests", type=int, default=2, help="requests per client per level (default 2)")
    v.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in words (the table shows the "
                   "server's token count)")
    v.add_argument("--gen-tokens", type=int, default=64, help="max_tokens per request (default 64)")
    v.add_argument("--turns", type=int, choices=(1, 2), default=1, help="2: a second turn per request resending "
                   "the first (the prefix cache's TTFT)")
    v.add_argument("--api-key", default=None, help="the server's API key")
    v.add_argument("--json", type=Path, default=None, help=JSON_HELP)
    v.add_argument("--label", default=None, help=LABEL_HELP)
    v.set_defaults(func=run_serve)


def run(args) -> int:
    from ..bench.decode import bench_hf, bench_megakernel, format_table

    for name in ("prompt_tokens", "gen_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise LucegenError(f"--{name.replace('_', '-')} must be at least 1")
    result = bench_megakernel(args.model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                              repeats=args.repeats, profile=args.profile, target=args.target)
    if not args.no_hf:
        hf, why = baseline("HF transformers", bench_hf, args.model, prompt_tokens=args.prompt_tokens,
                           gen_tokens=args.gen_tokens)
        result.update(hf)
        if why:
            result["hf_error"] = why
        else:
            result["speedup_vs_hf"] = result["tok_s"] / result["hf_tok_s"]
    print(format_table(result), file=table_stream(args))
    write_json(args.json, result, "decode", args.label)
    return 0


def run_prefill(args) -> int:
    from ..bench.prefill import bench_hf_prefill, bench_lucegen, format_table, gemm_shapes

    if args.repeats < 1:
        raise LucegenError("--repeats must be at least 1")
    if any(t < 1 for t in args.tokens):
        raise LucegenError(f"--tokens must be positive, got {args.tokens}")
    result = bench_lucegen(args.model, args.tokens, repeats=args.repeats, target=args.target)
    dec, pre = result.pop("_objects")
    if not args.no_gemm and result["engine"] == "quantised target":
        result["gemm_error"] = ("the quantised target's GEMMs read K-quant blocks; the table times the dense GEMM "
                                "against cuBLAS (a float checkpoint)")
    elif not args.no_gemm:
        from ..bench.gemm import bench_gemm_shapes

        shapes = []
        for t in sorted(set(args.tokens)):
            shapes += [s for s in gemm_shapes(dec.config, min(t, pre.segment)) if s not in shapes]
        gemm, why = baseline("cuBLAS GEMM", bench_gemm_shapes, dec.device, dec.target, pre.pf, shapes)
        if why:
            result["gemm_error"] = why
        else:
            result["gemm"] = gemm
    pre.close()
    dec.close()
    if not args.no_hf:
        hf, why = baseline("HF transformers", bench_hf_prefill, args.model, args.tokens,
                           max_tokens=args.hf_max_tokens)
        result.update(hf)
        if why:
            result["hf_error"] = why
        for row in result["rows"]:
            h = result.get("hf_tok_s", {}).get(row["tokens"])
            row["speedup_vs_hf"] = row["tok_s"] / h if h else None
    print(format_table(result), file=table_stream(args))
    result["hf_tok_s"] = {str(k): v for k, v in result.get("hf_tok_s", {}).items()}
    write_json(args.json, result, "prefill", args.label)
    return 0


def run_serve(args) -> int:
    import httpx

    from ..bench.serve import bench_serve, format_table

    for name in ("requests", "prompt_tokens", "gen_tokens"):
        if getattr(args, name) < 1:
            raise LucegenError(f"--{name.replace('_', '-')} must be at least 1")
    if any(n < 1 for n in args.clients):
        raise LucegenError(f"--clients must be positive, got {args.clients}")
    try:
        result = bench_serve(args.url, args.model, tuple(args.clients), args.requests, args.prompt_tokens,
                             args.gen_tokens, args.turns, args.api_key)
    except (OSError, RuntimeError, httpx.HTTPError, KeyError, ValueError) as exc:
        raise LucegenError(f"bench serve against {args.url}: {type(exc).__name__}: {exc}") from None
    print(format_table(result), file=table_stream(args))
    write_json(args.json, result, "serve", args.label)
    return 0


def run_dflash(args) -> int:
    from ..bench.dflash import BUDGETS, bench_dflash, format_table

    for name in ("prompt_tokens", "gen_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise LucegenError(f"--{name.replace('_', '-')} must be at least 1")
    budgets = tuple(args.budgets or BUDGETS)
    if any(b < 0 for b in budgets):
        raise LucegenError(f"--budgets must be non-negative, got {list(budgets)}")
    check_draft_ring(args)
    result = bench_dflash(args.model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                          repeats=args.repeats, budgets=budgets, target=args.target, draft=args.draft,
                          top_k=args.top_k, kv_cache=args.kv_cache, draft_ring=args.draft_ring)
    print(format_table(result), file=table_stream(args))
    write_json(args.json, result, "dflash", args.label)
    return 0

"""Prefill benchmark: ppN (a random N-token prompt) through the generated prefill kernels, with the HF transformers
baseline and the per-GEMM-shape ratio to cuBLAS measured in the same run.

Timing: each repeat zeroes the sequence state (outside the timed region), then times the whole prefill (every
segment, the final norm, lm_head row and argmax) with CUDA events on the prefill stream; the CUDA graphs of the
segments are captured by a warm-up call first. tok/s is N over the median. Time to first token is the wall time of
a complete ``Prefiller.prefill`` call (upload, graph launch, sync, reading the token back) with graphs cached;
``first_call_ms`` is the same call with graph capture included (what a new prompt length costs once).

TFLOP/s counts the matrix work: 2 * T * (weights of every projection, MLP and out-projection), the causal attention
(2 * 2 * NH * HD per query-key pair) and the one lm_head row; the DeltaNet's chunked recurrence is not counted.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..errors import LucegenError


def matmul_flops(config, T: int, pos0: int = 0) -> float:
    """Matrix FLOPs of prefilling T tokens after pos0 (see the module docstring)."""
    c = config
    h = c.hidden_size
    per_token = 0
    attention = 0.0
    keys = float(sum(pos0 + t + 1 for t in range(T)))  # causal query-key pairs
    for kind in c.layer_types:
        if kind == "full_attention":
            per_token += (c.q_proj_dim + 2 * c.kv_dim) * h + h * c.num_attention_heads * c.head_dim
            attention += 2 * 2 * c.num_attention_heads * c.head_dim * keys
        else:
            per_token += (c.conv_dim + c.linear_value_dim + 2 * c.linear_num_value_heads) * h + h * c.linear_value_dim
        per_token += 3 * h * c.intermediate_size
    return 2.0 * T * per_token + attention + 2.0 * c.vocab_size * h


def time_prefill_graph(dec, pre, prompt, repeats: int, events=None) -> list[float]:
    """ms of each of ``repeats`` graph launches of the whole prefill of ``prompt`` (CUDA events on the prefill
    stream; the state is reset and the prompt staged outside the timed region). Graphs must be captured already."""
    dev = dec.device
    start, end = events or (dev.event(), dev.event())
    times = []
    for _ in range(repeats):
        dec.reset()
        n = pre.stage(prompt)
        dev.synchronize()
        start.record(pre.stream)
        pre.launch(n)
        end.record(pre.stream)
        end.synchronize()
        times.append(start.elapsed_ms(end))
    return times


def bench_lucegen(model, token_counts, *, repeats: int = 10, target=None, seed: int = 0) -> dict:
    from ..runtime.megakernel import MegakernelDecoder
    from ..runtime.prefill.runner import Prefiller

    longest = max(token_counts)
    t0 = time.perf_counter()
    dec = MegakernelDecoder(model, target=target, max_context=longest + 1)
    pre = Prefiller(dec)
    load_s = time.perf_counter() - t0
    cfg, dev, tgt = dec.config, dec.device, dec.target
    rng = np.random.default_rng(seed)
    start, end = dev.event(), dev.event()
    rows = []
    for T in token_counts:
        prompt = rng.integers(0, cfg.vocab_size, T).astype(np.int32)
        dec.reset()
        dev.synchronize()
        w0 = time.perf_counter()
        first = pre.prefill(prompt)  # captures the graphs
        first_call_ms = (time.perf_counter() - w0) * 1e3
        times, walls = time_prefill_graph(dec, pre, prompt, repeats, (start, end)), []
        for _ in range(max(3, repeats // 2)):
            dec.reset()
            dev.synchronize()
            w0 = time.perf_counter()
            token = pre.prefill(prompt)
            walls.append((time.perf_counter() - w0) * 1e3)
            if token != first:
                raise LucegenError(f"pp{T}: prefill gave token {token}, then {first}: not deterministic")
        ms = statistics.median(times)
        flops = matmul_flops(cfg, T)
        rows.append({
            "tokens": T, "ms": ms, "ms_min": min(times), "tok_s": T / (ms / 1e3),
            "tflops": flops / (ms / 1e3) / 1e12, "peak_fraction": flops / (ms / 1e3) / 1e12 / tgt.matmul.peak_tflops,
            "ttft_ms": statistics.median(walls), "first_call_ms": first_call_ms, "segments": -(-T // pre.segment),
            "next_token": first,
        })
    result = {"target": tgt.name, "device": dev.name, "model": cfg.name, "repeats": repeats, "load_s": load_s,
              "segment": pre.segment, "peak_tflops": tgt.matmul.peak_tflops, "rows": rows}
    result["_objects"] = (dec, pre)
    return result


def bench_hf_prefill(model_dir, token_counts, *, repeats: int = 3, seed: int = 0, max_tokens: int = 8192) -> dict:
    """HF transformers Qwen3_5ForCausalLM forward over the prompt (BF16, GPU, logits of the last position only)."""
    from .hf import load_hf_model

    torch, transformers, model = load_hf_model(model_dir)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(seed)
    out = {}
    for T in token_counts:
        if T > max_tokens:
            out[T] = None
            continue
        ids = torch.tensor(rng.integers(0, vocab, T), device="cuda")[None]
        try:
            with torch.no_grad():
                model(ids, use_cache=True, logits_to_keep=1)  # warm-up
                torch.cuda.synchronize()
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    model(ids, use_cache=True, logits_to_keep=1)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
            out[T] = T / statistics.median(times)
        except torch.cuda.OutOfMemoryError:
            out[T] = None
            torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
    return {"hf_tok_s": out, "hf_version": transformers.__version__}


def gemm_shapes(config, T: int) -> list[tuple[int, int, int, str]]:
    """The distinct GEMM shapes of prefilling T tokens: (M, N, K, epilogue)."""
    c = config
    h = c.hidden_size
    shapes = []
    kinds = set(c.layer_types)
    if "linear_attention" in kinds:
        shapes += [(T, c.conv_dim + c.linear_value_dim + 2 * c.linear_num_value_heads, h, "rows_f32"),
                   (T, h, c.linear_value_dim, "residual")]
    if "full_attention" in kinds:
        shapes += [(T, c.q_proj_dim + 2 * c.kv_dim, h, "rows_f32"), (T, h, c.num_attention_heads * c.head_dim,
                                                                     "residual")]
    shapes += [(T, 2 * c.intermediate_size, h, "swiglu"), (T, h, c.intermediate_size, "residual"),
               (1, c.vocab_size, h, "rows_f32")]
    return shapes


def format_table(r: dict) -> str:
    lines = [f"device / target  {r['device']} / {r['target']}   model {r['model']}   segment {r['segment']} tokens",
             f"{'prompt':>8} {'tok/s':>10} {'ms':>9} {'TFLOP/s':>8} {'% peak':>7} {'TTFT ms':>9} {'1st call':>9}"
             f" {'HF tok/s':>9} {'vs HF':>7}"]
    hf = r.get("hf_tok_s", {})
    for row in r["rows"]:
        h = hf.get(row["tokens"])
        hf_text = f"{h:.0f}" if h else "n/a"
        ratio_text = f"{row['tok_s'] / h:.1f}x" if h else "n/a"
        lines.append(f"pp{row['tokens']:<6} {row['tok_s']:>10.0f} {row['ms']:>9.3f} {row['tflops']:>8.1f} "
                     f"{100 * row['peak_fraction']:>6.1f}% {row['ttft_ms']:>9.2f} {row['first_call_ms']:>9.1f} "
                     f"{hf_text:>9} {ratio_text:>7}")
    hf_note = f"transformers {r['hf_version']}, BF16" if "hf_version" in r else \
        f"not measured ({r['hf_error']})" if "hf_error" in r else "not run"
    lines.append(f"(% peak: of the descriptor's {r['peak_tflops']} dense TFLOP/s; HF: {hf_note})")
    if r.get("gemm_error"):
        lines.append(f"(GEMM vs cuBLAS: not measured ({r['gemm_error']}))")
    if r.get("gemm"):
        lines.append(f"{'GEMM M x N x K':>24} {'epilogue':>9} {'ours µs':>9} {'TFLOP/s':>8} {'cuBLAS µs':>10} "
                     f"{'TFLOP/s':>8} {'ratio':>6}")
        for g in r["gemm"]:
            lines.append(f"{g['M']:>8} x {g['N']:>6} x {g['K']:>5} {g['epilogue']:>9} {g['ours_us']:>9.1f} "
                         f"{g['ours_tflops']:>8.1f} {g['cublas_us']:>10.1f} {g['cublas_tflops']:>8.1f} "
                         f"{g['ratio']:>6.2f}")
        lines.append("(ratio = cuBLAS time / ours: above 1 means faster than torch.matmul on the same shape)")
    return "\n".join(lines)

"""Decode benchmark: the megakernel's tg-N after a P-token prompt, NVML energy, per-phase profile, and the HF
transformers baseline measured in the same run.

Timing: the prompt is prefilled once and the device state snapshotted; each repeat restores the snapshot (a
device-to-device copy, outside the timed region) and times one launch of N greedy steps with CUDA events. tok/s is
N over the median launch time. Energy: NVML's total-energy counter of the GPU (lucegen/runtime/energy.py) read
around all repeats (restores included, which are ~10 µs each), divided by the tokens generated.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from ..runtime.energy import EnergyMeter, energy_j

PHASE_NAMES = {0: ("dn_in_proj", "delta_rule", "dn_out_proj", "mlp_gate_up", "mlp_down"),
               1: ("attn_qkv_proj", "attention", "attn_o_proj", "mlp_gate_up", "mlp_down")}


def phase_names(layer_kinds: list[int]) -> list[str]:
    """The name of each phase of a step (one per layer phase, then the lm_head), in kernel order."""
    return [PHASE_NAMES[k][p] for k in layer_kinds for p in range(5)] + ["lm_head"]


def _sum_by_name(names: list[str], per_phase) -> dict:
    """Per phase type, the sum of ``per_phase[i]`` (a number or a row of numbers) over the phases of that type."""
    out: dict = {}
    for name, v in zip(names, per_phase):
        out[name] = out[name] + v if name in out else v
    return out


def profile_report(stamps: np.ndarray, layer_kinds: list[int]) -> dict:
    """Every view of a profiled launch's stamps [steps, phases, blocks, 4] (see ``RunResult.profile``)."""
    return {"profile_us_per_token": profile_summary(stamps[:, :, 0][..., [0, 3]], layer_kinds),
            "critical_path_us_per_token": critical_path(stamps, layer_kinds),
            "phase_breakdown_us_per_token": phase_breakdown(stamps, layer_kinds)}


def critical_path(stamps: np.ndarray, layer_kinds: list[int]) -> dict:
    """Where the token time goes across the whole grid, from every block's stamps [steps, phases, blocks, 4]: a phase
    is over when its last block is done, so per phase type the time from the previous phase's last block to this
    one's (µs per token); ``skew`` = the last block's lag behind the median block, summed over a step's phases;
    ``slowest_blocks`` = the blocks most often last (block: share of phases)."""
    stamps = stamps.astype(np.int64)
    steps, phases, blocks, _ = stamps.shape
    done = stamps[:, :, :, 3].reshape(steps * phases, blocks)
    last = done.max(axis=1)
    span = np.diff(last).astype(np.float64)  # entry i: phase i + 1 (flattened over steps)
    usable = max(1, steps - 1)  # the first step's first phase has no predecessor; average whole later steps
    span = span[phases - 1: phases - 1 + usable * phases].reshape(usable, phases)
    out = _sum_by_name(phase_names(layer_kinds), (float(x) / 1e3 for x in span.mean(axis=0)))
    out["total"] = float(span.sum(axis=1).mean()) / 1e3
    lag = (last - np.median(done, axis=1)).reshape(steps, phases)
    out["skew"] = float(lag[1:].sum(axis=1).mean() if steps > 1 else lag.sum()) / 1e3
    counts = np.bincount(done.argmax(axis=1), minlength=blocks)
    out["slowest_blocks"] = {int(b): round(float(counts[b]) / len(done), 3) for b in np.argsort(-counts)[:4]}
    return out


def phase_breakdown(stamps: np.ndarray, layer_kinds: list[int]) -> dict:
    """Per phase type, µs per token averaged over blocks: (wait at the grid barrier, staging the inputs, the rest),
    from the four stamps [steps, phases, blocks, 4]; a phase without a barrier or staging stamp counts it as 0."""
    stamps = stamps.astype(np.int64)
    steps = stamps.shape[0]
    start, done = stamps[..., 0], stamps[..., 3]
    released = np.where(stamps[..., 1] > 0, stamps[..., 1], start)
    staged = np.where(stamps[..., 2] > 0, stamps[..., 2], released)
    parts = np.stack([released - start, staged - released, done - staged], axis=-1).astype(np.float64)
    parts = parts[1:] if steps > 1 else parts  # the first step includes first-touch effects
    mean = parts.mean(axis=(0, 2)) / 1e3  # [phases, 3]
    return {k: [round(float(x), 1) for x in v] for k, v in _sum_by_name(phase_names(layer_kinds), mean).items()}


def profile_summary(stamps: np.ndarray, layer_kinds: list[int]) -> dict:
    """Per-phase-type time per token (µs) from block 0's globaltimer stamps [steps, phases, 2] (start, arrive):
    work = arrive - start; barrier = next phase's start - arrive (the wait for the slowest block + the barrier)."""
    stamps = stamps.astype(np.int64)
    steps, phases, _ = stamps.shape
    work = (stamps[:, :, 1] - stamps[:, :, 0]).astype(np.float64)
    starts = stamps[:, :, 0].reshape(-1)
    arrives = stamps[:, :, 1].reshape(-1)
    wait = np.zeros(steps * phases)
    wait[:-1] = starts[1:] - arrives[:-1]
    wait = wait.reshape(steps, phases)
    usable = slice(0, steps - 1) if steps > 1 else slice(0, 1)  # the last step has no following start
    out = _sum_by_name(phase_names(layer_kinds), (float(x) / 1e3 for x in work[usable].mean(axis=0)))
    out["barrier_wait"] = float(wait[usable].sum(axis=1).mean()) / 1e3
    out["total"] = float((stamps[usable.stop - 1 if steps > 1 else 0, -1, 1] - stamps[0, 0, 0])) / 1e3 / max(
        1, (usable.stop if steps > 1 else 1))
    return out


def _time_greedy(dec, prompt, gen_tokens: int, repeats: int, sampling=None):
    """tg-N launches of ``dec`` after ``prompt``, each replayed from the same state: (launch ms list, the last
    launch's tokens, wall seconds of the timed launches). ``sampling``: the sampled instance's launches instead
    (temperature alone: drawn in the kernel)."""
    dec.reset()
    dec.prefill(prompt)
    first = dec.next_token
    snap = dec.snapshot()
    start, end = dec.device.event(), dec.device.event()
    dec.launch([first], gen_tokens, sampling=sampling)  # warm-up launch (module load, first-touch)
    dec.collect()
    times, tokens = [], None
    w0 = time.perf_counter()
    for _ in range(repeats):
        dec.restore(snap)
        start.record()
        dec.launch([first], gen_tokens, sampling=sampling)
        end.record()
        times.append(start.elapsed_ms(end))
        tokens = dec.collect().tokens
    return times, tokens, time.perf_counter() - w0


def bench_megakernel(model, *, prompt_tokens: int = 32, gen_tokens: int = 128, repeats: int = 10,
                     max_context: int | None = None, profile: bool = False, target=None, seed: int = 0) -> dict:
    """tg-N of the megakernel: greedy steps with the lm_head screened where the kernel renders the screen
    (model/lm_screen.py), and, in the same run, the same launches reading the whole lm_head ("whole_lm_head") and
    the sampled instance's launches ("sampled": temperature 0.8, seed ``seed``)."""
    from ..model.sampling import SamplingParams
    from ..runtime.megakernel import MegakernelDecoder

    max_context = max_context or prompt_tokens + gen_tokens + 1
    t0 = time.perf_counter()
    dec = MegakernelDecoder(model, target=target, max_context=max_context)
    load_s = time.perf_counter() - t0
    cfg = dec.config
    prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, prompt_tokens).astype(np.int32)
    meter = EnergyMeter.for_device(dec.device)
    e0 = meter.read_mj()
    times, tokens, wall = _time_greedy(dec, prompt, gen_tokens, repeats)
    e1 = meter.read_mj()
    meter.close()
    ms = statistics.median(times)
    t = dec.device.target
    bytes_per_token = dec.bytes_per_token()
    tok_s = gen_tokens / (ms / 1e3)
    result = {
        "target": t.name, "device": dec.device.name,
        "model": cfg.name if cfg.name != "custom" else f"{Path(str(model)).name} ({cfg.num_parameters() / 1e6:.0f} M params)",
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens, "repeats": repeats, "blocks": dec.blocks, "threads": dec.threads,
        "registers": dec.compiled.kernels[0].registers, "load_s": round(load_s, 2),
        "lm_screen": dec.lm_screen,
        "ms_per_launch_median": ms, "ms_per_launch_min": min(times), "ms_per_token": ms / gen_tokens,
        "tok_s": tok_s, "tok_s_best": gen_tokens / (min(times) / 1e3),
        "bytes_per_token": bytes_per_token, "achieved_gbs": bytes_per_token * tok_s / 1e9,
        "descriptor_gbs": t.mem_bandwidth_gbs,
        "bandwidth_fraction": bytes_per_token * tok_s / 1e9 / t.mem_bandwidth_gbs,
        "barriers_per_token": dec.barriers_per_step,
        "energy_j": energy_j(e0, e1),
        "tokens_sample": [int(x) for x in tokens[:16]],
    }
    if result["energy_j"]:
        result["tok_per_j"] = gen_tokens * repeats / result["energy_j"]
        result["avg_power_w"] = result["energy_j"] / wall
    else:
        result["tok_per_j"] = None
    s_times, _, _ = _time_greedy(dec, prompt, gen_tokens, repeats, SamplingParams(temperature=0.8, seed=seed))
    s_ms = statistics.median(s_times)
    result["sampled"] = {"temperature": 0.8, "tok_s": gen_tokens / (s_ms / 1e3),
                         "tok_s_best": gen_tokens / (min(s_times) / 1e3), "ms_per_token": s_ms / gen_tokens}
    dec.close()
    if result["lm_screen"]:
        whole = MegakernelDecoder(model, target=target, max_context=max_context, device=dec.device, lm_screen=False)
        w_times, w_tokens, _ = _time_greedy(whole, prompt, gen_tokens, repeats)
        w_ms = statistics.median(w_times)
        result["whole_lm_head"] = {
            "tok_s": gen_tokens / (w_ms / 1e3), "tok_s_best": gen_tokens / (min(w_times) / 1e3),
            "ms_per_token": w_ms / gen_tokens, "bytes_per_token": whole.bytes_per_token(),
            "barriers_per_token": whole.barriers_per_step, "tokens_equal": bool(np.array_equal(w_tokens, tokens)),
        }
        whole.close()
    if profile:
        pdec = MegakernelDecoder(model, target=target, max_context=max_context, profile=True,
                                 device=dec.device)
        pdec.reset()
        pdec.prefill(prompt)
        pdec.launch([pdec.next_token], gen_tokens)
        stamps = pdec.collect().profile
        result.update(profile_report(stamps, [l.kind for l in pdec.layout.layers]))
        pdec.close()
    return result


def bench_hf(model_dir, *, prompt_tokens: int = 32, gen_tokens: int = 128, seed: int = 0) -> dict:
    """HF transformers Qwen3_5ForCausalLM, BF16 on the GPU, greedy with its KV cache, timed with cuda sync."""
    from .hf import load_hf_model

    torch, transformers, model = load_hf_model(model_dir)
    vocab = model.config.vocab_size
    prompt = torch.tensor(np.random.default_rng(seed).integers(0, vocab, prompt_tokens), device="cuda")[None]

    def run(model, n):
        with torch.no_grad():
            out = model(prompt, use_cache=True)
            cache = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                out = model(tok, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

    run(model, 4)  # warm-up
    seconds = run(model, gen_tokens)
    del model
    torch.cuda.empty_cache()
    return {"hf_tok_s": gen_tokens / seconds, "hf_ms_per_token": seconds * 1e3 / gen_tokens,
            "hf_version": transformers.__version__}


def format_table(r: dict) -> str:
    rows = [
        ("device / target", f"{r['device']} / {r['target']} ({r['blocks']} blocks x {r['threads']} threads, "
                            f"{r['registers']} regs)"),
        ("model", f"{r['model']}, tg{r['gen_tokens']} after a {r['prompt_tokens']}-token prompt"),
        ("decode tok/s (median)", f"{r['tok_s']:.0f}  (best {r['tok_s_best']:.0f})"),
        ("ms / token", f"{r['ms_per_token']:.4f}"),
        ("bytes / token", f"{r['bytes_per_token'] / 1e9:.3f} GB"),
        ("achieved bandwidth", f"{r['achieved_gbs']:.0f} GB/s = {100 * r['bandwidth_fraction']:.1f}% of the "
                               f"descriptor's {r['descriptor_gbs']:.0f} GB/s"),
        ("grid barriers / token", str(r["barriers_per_token"])),
        ("lm_head", "6-bit screen + exact candidate rows (greedy)" if r.get("lm_screen") else "whole"),
        ("tok/J (NVML)", "n/a (NVML unavailable)" if not r.get("tok_per_j") else
         f"{r['tok_per_j']:.1f}  ({r['avg_power_w']:.0f} W average)"),
    ]
    whole = r.get("whole_lm_head")
    if whole:
        rows.append(("whole lm_head, same run", f"{whole['tok_s']:.0f} tok/s  (best {whole['tok_s_best']:.0f}), "
                     f"{whole['ms_per_token']:.4f} ms / token, {whole['bytes_per_token'] / 1e9:.3f} GB / token; "
                     f"tokens {'equal' if whole['tokens_equal'] else 'DIFFER'}"))
        rows.append(("screen speed-up", f"{r['tok_s'] / whole['tok_s']:.3f}x"))
    sampled = r.get("sampled")
    if sampled:
        rows.append(("sampled, same run", f"{sampled['tok_s']:.0f} tok/s  (best {sampled['tok_s_best']:.0f}), "
                     f"temperature {sampled['temperature']}, drawn in the kernel (whole lm_head)"))
    if "hf_tok_s" in r:
        rows.append(("HF transformers tok/s", f"{r['hf_tok_s']:.1f}  (transformers {r['hf_version']}, BF16)"))
        rows.append(("speed-up vs HF", f"{r['tok_s'] / r['hf_tok_s']:.1f}x"))
    elif "hf_error" in r:
        rows.append(("HF transformers tok/s", f"not measured ({r['hf_error']})"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    prof = r.get("profile_us_per_token")
    if prof:
        lines.append("per-phase time per token (block 0, µs):")
        for k, v in prof.items():
            lines.append(f"  {k.ljust(width - 2)}  {v:8.1f}")
        crit = r["critical_path_us_per_token"]
        lines.append("critical path per token (phase end to phase end, last block, µs):")
        for k, v in crit.items():
            lines.append(f"  {k.ljust(width - 2)}  {v}" if k == "slowest_blocks" else f"  {k.ljust(width - 2)}  {v:8.1f}")
        lines.append("per phase, mean over blocks (barrier wait / input staging / rest, µs per token):")
        for k, (w, st, rest) in r["phase_breakdown_us_per_token"].items():
            lines.append(f"  {k.ljust(width - 2)}  {w:8.1f} {st:8.1f} {rest:8.1f}")
    return "\n".join(lines)

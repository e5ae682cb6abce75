"""Speculative-decoding benchmark, acceptance-controlled: ``lucegen bench dflash --model DIR|FILE.gguf``.

Random weights accept nothing a real draft proposes, so the proposals are the oracle's (lucegen/runtime/dflash.py):
the target's own greedy continuation, corrupted every ``AL``-th position, under chain verify. A step then accepts
the tokens up to the next corruption and emits exactly ``AL`` tokens (the last one the bonus), so the acceptance
length is set, not hoped for. With ``draft`` (a DFlash draft directory) the network runs every step as it would
in earnest (``ControlledDrafter``: its block forward, top-k and context ingest are in the ``draft`` column, the
verify captures its hidden states) and only its proposals are replaced; without one the ``draft`` column is the
oracle's host time and the table says so. The target is ``open_target``'s: a K-quant GGUF runs as the quantised
target, with or without the draft network.

Measured in one run on one model:

- AR: the target's plain greedy decode (tg-N after the prompt): the megakernel for a BF16 model (CUDA-event timed
  launch), one-slot verify passes queued on the device for a quantised GGUF (``TreeVerifier.decode``, wall time);
  and greedy through one-slot verify passes step by step (what the lossless guarantee is stated against);
- verify cost against the number of slots (1 + budget): wall time of ``TreeVerifier.verify`` (upload, every
  launch, the argmax read back), median of repeats, and its ratio to a megakernel AR step;
- per AL: spec tok/s (emitted tokens over the loop's wall time), the speed-up against both ARs, and the step's
  breakdown (draft, tree, verify, commit);
- the draft network's block forward alone (median wall time of ``propose``), when there is one;
- a projection, labelled as such, at the reference's mean HumanEval acceptance length (REFERENCE_AL): that AL over
  a step made of the measured draft, tree and commit times of the closest AL row and the measured verify at the
  reference's budget (REFERENCE_BUDGET).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..errors import LucegenError

BUDGETS = (0, 1, 8, 16, 22, 32, 64)
ACCEPTANCE_LENGTHS = (1, 2, 4, 8, 16)
#: The reference's mean acceptance length and tree budget on HumanEval (Qwen3.5-27B Q4_K_M + z-lab DFlash draft, RTX
#: 3090): Luce-Org/lucebox-hub dflash/RESULTS.md, "Headline" table (AL 8.31, DDTree budget 22).
REFERENCE_AL, REFERENCE_BUDGET = 8.31, 22


def bench_engine(model, *, prompt_tokens: int = 32, gen_tokens: int = 128, budgets=BUDGETS,
                 acceptance_lengths=ACCEPTANCE_LENGTHS, target=None, draft=None, top_k: int = 8,
                 kv_cache: str | None = None, draft_ring: int | None = None, device=None):
    """(decoder, draft network or None, prefiller, verifier) as :func:`bench_dflash` builds them: a context for the
    prompt, two generations and the largest tree, a verifier for the largest budget or acceptance length."""
    from ..runtime.draft import DFlashDrafter
    from ..runtime.prefill.runner import Prefiller
    from ..runtime.quant_target import open_target
    from ..runtime.tree_verify import TreeVerifier

    max_budget = max(max(budgets), max(acceptance_lengths))
    dec = open_target(model, target=target, max_context=prompt_tokens + 2 * gen_tokens + max_budget + 2,
                      kv_cache=kv_cache, device=device)
    network = DFlashDrafter(dec, draft, k=top_k, ring=draft_ring, rows=max(64, max_budget + 1)) if draft else None
    return dec, network, Prefiller(dec, draft=network), TreeVerifier(dec, budget=max_budget, draft=network)


def bench_dflash(model, *, prompt_tokens: int = 32, gen_tokens: int = 128, repeats: int = 10, budgets=BUDGETS,
                 acceptance_lengths=ACCEPTANCE_LENGTHS, target=None, seed: int = 0, draft=None,
                 top_k: int = 8, kv_cache: str | None = None, draft_ring: int | None = None) -> dict:
    from ..runtime import ddtree
    from ..runtime.dflash import ControlledDrafter, OracleDrafter, SpecDecoder
    from ..runtime.memory_plan import MemoryPlan
    from ..runtime.megakernel import MegakernelDecoder

    depth = max(acceptance_lengths)
    dec, network, pre, ver = bench_engine(model, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, budgets=budgets,
                                          acceptance_lengths=acceptance_lengths, target=target, draft=draft,
                                          top_k=top_k, kv_cache=kv_cache, draft_ring=draft_ring)
    plan = MemoryPlan.of_engine(dec, ver, network)
    cfg, dev = dec.config, dec.device
    prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, prompt_tokens).astype(np.int32)

    def start():
        dec.reset()
        if network:
            network.reset()
        return pre.prefill(prompt)

    # AR 1: the target's plain decode (megakernel: CUDA events around one launch of gen_tokens steps; quantised:
    # gen_tokens one-slot passes queued on the device)
    t0, t1 = dev.event(), dev.event()
    ar_ms = []
    ar_kind = "megakernel" if isinstance(dec, MegakernelDecoder) else "one-slot passes queued on the device"
    for _ in range(repeats):
        start()
        dev.synchronize()
        if isinstance(dec, MegakernelDecoder):
            t0.record()
            dec.launch([dec.next_token], gen_tokens)
            t1.record()
            t1.synchronize()
            ar_ms.append(t0.elapsed_ms(t1) / gen_tokens)
        else:
            w0 = time.perf_counter()
            ver.decode(gen_tokens + 1)
            ar_ms.append((time.perf_counter() - w0) * 1e3 / gen_tokens)
    ar_step = statistics.median(ar_ms)
    # AR 2: greedy through one-slot verify passes; its tokens are the oracle's continuation
    start()
    w0 = time.perf_counter()
    truth = ver.greedy(gen_tokens + depth + 1)
    verify_ar_step = (time.perf_counter() - w0) * 1e3 / (gen_tokens + depth)
    # verify cost against slots (the oracle's chain, so that the tree is the requested size)
    verify_rows = []
    for budget in budgets:
        start()
        tree = ddtree.chain(np.asarray(truth[1 : budget + 1], np.int64))
        ver.verify(tree, truth[0])  # warm-up
        walls = []
        for _ in range(repeats):
            w0 = time.perf_counter()
            ver.verify(tree, truth[0])
            walls.append((time.perf_counter() - w0) * 1e3)
        ms = statistics.median(walls)
        verify_rows.append({"budget": budget, "slots": budget + 1, "ms": ms, "vs_ar_step": ms / ar_step})
    # the draft network's block forward (top-k included) after the prompt
    draft_ms = None
    if network:
        root = start()
        network.propose([root])  # warm-up: captures the block graph
        walls = []
        for _ in range(repeats):
            w0 = time.perf_counter()
            network.propose([root])
            walls.append((time.perf_counter() - w0) * 1e3)
        draft_ms = statistics.median(walls)
    # acceptance-controlled speculative decoding
    spec_rows = []
    for al in acceptance_lengths:
        corrupt = frozenset(range(al, len(truth), al))  # the step from root r accepts r+1 .. next corruption - 1

        def decoder() -> SpecDecoder:
            drafter = OracleDrafter(truth, cfg.vocab_size, depth=al, k=1, corrupt=corrupt, seed=seed)
            return SpecDecoder(ver, ControlledDrafter(network, drafter) if network else drafter, budget=depth,
                               tree=False)

        # warm-up, the same run untimed: its passes (slot counts, attention bodies) capture their graphs here, not in
        # the timed run, whatever budgets ran before (measured on the H100: after --budgets 22 32 64 alone, captures
        # inside the timed run made the AL 8 row's verify 15.0 ms a step against 8.9)
        start()
        decoder().generate(gen_tokens)
        start()
        spec = decoder()
        w0 = time.perf_counter()
        got = spec.generate(gen_tokens)
        wall = time.perf_counter() - w0
        if got != truth[:gen_tokens]:
            raise LucegenError(f"AL {al}: speculative decoding diverged from greedy (not lossless)")
        s = spec.stats
        tok_s = (len(got) - 1) / wall  # the first token is the prefill's
        spec_rows.append({"al_target": al, "al": s.acceptance_length, "steps": s.steps, "tok_s": tok_s,
                          "vs_ar": tok_s * ar_step / 1e3, "vs_verify_ar": tok_s * verify_ar_step / 1e3,
                          "ms_per_step": {k: v * 1e3 / s.steps for k, v in s.seconds.items()}})
    result = {"target": dec.target.name, "device": dev.name, "model": cfg.name, "prompt_tokens": prompt_tokens,
              "gen_tokens": gen_tokens, "repeats": repeats, "ar": ar_kind, "ar_ms_per_token": ar_step,
              "ar_tok_s": 1e3 / ar_step, "weights_gb": getattr(dec, "weight_bytes", 0) / 1e9,
              "kv_cache": dec.kv_format.name,
              "verify_ar_ms_per_token": verify_ar_step,
              "verify_ar_tok_s": 1e3 / verify_ar_step, "verify": verify_rows, "spec": spec_rows,
              "draft": (f"DFlash {network.config.name} (runs every step, top-{top_k}, a context ring of "
                        f"{network.ring}; proposals from the oracle)"
                        if network else "oracle (no draft network: its cost is not included)"),
              "draft_forward_ms": draft_ms, "projection": projection(verify_rows, spec_rows, ar_step),
              "memory_plan": plan.format()}
    for part in (ver, pre, network, dec):
        if part:
            part.close()
    return result


def projection(verify_rows, spec_rows, ar_step: float) -> dict | None:
    """Projected spec tok/s at REFERENCE_AL (a projection, not a measurement): a step = the measured draft, tree and
    commit ms of the AL row closest to it + the measured verify at REFERENCE_BUDGET."""
    verify = {v["budget"]: v["ms"] for v in verify_rows}
    if REFERENCE_BUDGET not in verify or not spec_rows:
        return None
    row = min(spec_rows, key=lambda s: abs(s["al"] - REFERENCE_AL))
    ms = row["ms_per_step"]
    step = ms["draft"] + ms["tree"] + ms["commit"] + verify[REFERENCE_BUDGET]
    tok_s = REFERENCE_AL / step * 1e3
    return {"al": REFERENCE_AL, "budget": REFERENCE_BUDGET, "step_ms": step, "tok_s": tok_s,
            "vs_ar": tok_s * ar_step / 1e3, "from_al_row": row["al"],
            "source": "Luce-Org/lucebox-hub dflash/RESULTS.md (HumanEval mean AL, budget 22)"}


def format_table(r: dict) -> str:
    lines = [f"device / target  {r['device']} / {r['target']}   model {r['model']}   tg{r['gen_tokens']} after "
             f"{r['prompt_tokens']} prompt tokens   KV cache {r['kv_cache']}   drafter: {r['draft']}",
             *([f"draft forward    {r['draft_forward_ms']:.3f} ms (one block + top-k, wall)"]
               if r.get("draft_forward_ms") is not None else []),
             f"AR ({r['ar']})  {r['ar_tok_s']:.1f} tok/s ({r['ar_ms_per_token']:.3f} ms/token; weights "
             f"{r['weights_gb']:.2f} GB)",
             f"AR verify path   {r['verify_ar_tok_s']:.0f} tok/s ({r['verify_ar_ms_per_token']:.3f} ms/token: "
             f"one-slot verify passes, the lossless reference)",
             f"{'budget':>7} {'slots':>6} {'verify ms':>10} {'x AR step':>10}"]
    for v in r["verify"]:
        lines.append(f"{v['budget']:>7} {v['slots']:>6} {v['ms']:>10.3f} {v['vs_ar_step']:>10.2f}")
    lines.append(f"{'AL':>5} {'steps':>6} {'spec tok/s':>11} {'x AR':>13} {'x verify AR':>12} "
                 f"{'draft':>7} {'tree':>7} {'verify':>7} {'commit':>7}  (ms per step)")
    for s in r["spec"]:
        ms = s["ms_per_step"]
        lines.append(f"{s['al']:>5.2f} {s['steps']:>6} {s['tok_s']:>11.1f} {s['vs_ar']:>13.2f} "
                     f"{s['vs_verify_ar']:>12.2f} {ms['draft']:>7.3f} {ms['tree']:>7.3f} {ms['verify']:>7.3f} "
                     f"{ms['commit']:>7.3f}")
    p = r.get("projection")
    if p:
        lines.append(f"PROJECTION at the reference's HumanEval AL {p['al']} (budget {p['budget']} verify + the AL "
                     f"{p['from_al_row']:.0f} row's draft/tree/commit; {p['source']}): {p['tok_s']:.0f} tok/s, "
                     f"{p['vs_ar']:.2f}x AR, {p['step_ms']:.3f} ms per step")
    if r.get("memory_plan"):
        lines.append(r["memory_plan"])
    return "\n".join(lines)

"""Speculative-decoding benchmark, acceptance-controlled: ``lucegen bench dflash --model DIR``.

Random weights accept nothing a real draft proposes, so the drafter is the oracle (lucegen/runtime/dflash.py): the
target's own greedy continuation, corrupted every ``AL``-th position, under chain verify. A step then accepts the
tokens up to the next corruption and emits exactly ``AL`` tokens (the last one the bonus), so the acceptance length
is set, not hoped for. The DFlash draft network is not built yet: its cost is **not** in these figures (the
``draft`` column is the oracle's host time), and the table says so.

Measured in one run on one model:

- AR: the megakernel's greedy decode (tg-N after the prompt, CUDA-event timed, the project's decode) and greedy
  through one-slot verify passes (what the lossless guarantee is stated against);
- verify cost against the number of slots (1 + budget): wall time of ``TreeVerifier.verify`` (upload, every
  launch, the argmax read back), median of repeats, and its ratio to a megakernel AR step;
- per AL: spec tok/s (emitted tokens over the loop's wall time), the speed-up against both ARs, and the step's
  breakdown (draft, tree, verify, commit).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..errors import LucegenError

BUDGETS = (0, 1, 8, 16, 22, 32, 64)
ACCEPTANCE_LENGTHS = (1, 2, 4, 8, 16)


def bench_dflash(model, *, prompt_tokens: int = 32, gen_tokens: int = 128, repeats: int = 10, budgets=BUDGETS,
                 acceptance_lengths=ACCEPTANCE_LENGTHS, target=None, seed: int = 0) -> dict:
    from ..runtime import ddtree
    from ..runtime.dflash import OracleDrafter, SpecDecoder
    from ..runtime.megakernel import MegakernelDecoder
    from ..runtime.prefill.runner import Prefiller
    from ..runtime.tree_verify import TreeVerifier

    depth = max(acceptance_lengths)
    max_budget = max(max(budgets), depth)
    dec = MegakernelDecoder(model, target=target, max_context=prompt_tokens + 2 * gen_tokens + max_budget + 2)
    pre, ver = Prefiller(dec), TreeVerifier(dec, budget=max_budget)
    cfg, dev = dec.config, dec.device
    prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, prompt_tokens).astype(np.int32)

    def start():
        dec.reset()
        return pre.prefill(prompt)

    # AR 1: the megakernel (CUDA events around one launch of gen_tokens steps)
    t0, t1 = dev.event(), dev.event()
    mk_ms = []
    for _ in range(repeats):
        start()
        dev.synchronize()
        t0.record()
        dec.launch([dec.next_token], gen_tokens)
        t1.record()
        t1.synchronize()
        mk_ms.append(t0.elapsed_ms(t1) / gen_tokens)
    mk_step = statistics.median(mk_ms)
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
        verify_rows.append({"budget": budget, "slots": budget + 1, "ms": ms, "vs_ar_step": ms / mk_step})
    # acceptance-controlled speculative decoding
    spec_rows = []
    for al in acceptance_lengths:
        start()
        corrupt = frozenset(range(al, len(truth), al))  # the step from root r accepts r+1 .. next corruption - 1
        spec = SpecDecoder(ver, OracleDrafter(truth, cfg.vocab_size, depth=al, k=1, corrupt=corrupt, seed=seed),
                           budget=depth, tree=False)
        w0 = time.perf_counter()
        got = spec.generate(gen_tokens)
        wall = time.perf_counter() - w0
        if got != truth[:gen_tokens]:
            raise LucegenError(f"AL {al}: speculative decoding diverged from greedy (not lossless)")
        s = spec.stats
        tok_s = (len(got) - 1) / wall  # the first token is the prefill's
        spec_rows.append({"al_target": al, "al": s.acceptance_length, "steps": s.steps, "tok_s": tok_s,
                          "vs_megakernel": tok_s * mk_step / 1e3, "vs_verify_ar": tok_s * verify_ar_step / 1e3,
                          "ms_per_step": {k: v * 1e3 / s.steps for k, v in s.seconds.items()}})
    result = {"target": dec.target.name, "device": dev.name, "model": cfg.name, "prompt_tokens": prompt_tokens,
              "gen_tokens": gen_tokens, "repeats": repeats, "megakernel_ms_per_token": mk_step,
              "megakernel_tok_s": 1e3 / mk_step, "verify_ar_ms_per_token": verify_ar_step,
              "verify_ar_tok_s": 1e3 / verify_ar_step, "verify": verify_rows, "spec": spec_rows,
              "draft": "oracle (no draft network: its cost is not included)"}
    ver.close()
    pre.close()
    dec.close()
    return result


def format_table(r: dict) -> str:
    lines = [f"device / target  {r['device']} / {r['target']}   model {r['model']}   tg{r['gen_tokens']} after "
             f"{r['prompt_tokens']} prompt tokens   drafter: {r['draft']}",
             f"AR megakernel    {r['megakernel_tok_s']:.0f} tok/s ({r['megakernel_ms_per_token']:.3f} ms/token)",
             f"AR verify path   {r['verify_ar_tok_s']:.0f} tok/s ({r['verify_ar_ms_per_token']:.3f} ms/token: "
             f"one-slot verify passes, the lossless reference)",
             f"{'budget':>7} {'slots':>6} {'verify ms':>10} {'x AR step':>10}"]
    for v in r["verify"]:
        lines.append(f"{v['budget']:>7} {v['slots']:>6} {v['ms']:>10.3f} {v['vs_ar_step']:>10.2f}")
    lines.append(f"{'AL':>5} {'steps':>6} {'spec tok/s':>11} {'x megakernel':>13} {'x verify AR':>12} "
                 f"{'draft':>7} {'tree':>7} {'verify':>7} {'commit':>7}  (ms per step)")
    for s in r["spec"]:
        ms = s["ms_per_step"]
        lines.append(f"{s['al']:>5.2f} {s['steps']:>6} {s['tok_s']:>11.0f} {s['vs_megakernel']:>13.2f} "
                     f"{s['vs_verify_ar']:>12.2f} {ms['draft']:>7.3f} {ms['tree']:>7.3f} {ms['verify']:>7.3f} "
                     f"{ms['commit']:>7.3f}")
    return "\n".join(lines)

"""How far the numpy oracle disagrees with itself: the noise floor under the GPU tests' error bounds.

    python experiments/oracle_floor.py CHECKPOINT_DIR|PRESET [--lengths 1 333 ...] [--random N] [--seeds 2]

For each prompt it runs ``Reference(gemm_inputs="bf16")`` (the rounded oracle), the same oracle with every
projection input nudged by one float32 ulp of random sign (relative noise 2^-23: smaller than any difference of
summation order on a GPU), and the plain f32 oracle, and prints the metrics the tests bound (last-row logits
max |err| / max |ref|, cosine, and per state kind the worst layer's max |err| / max |ref|) for
  perturbed vs rounded: what a kernel that is exact up to f32 rounding order can still be off by,
  rounded vs f32:       what the bf16 GEMM inputs alone move the result from the f32 model.
A bf16 rounding that lands on the other side of a half-way point moves an input by 2^-8, and the layers after it
amplify that; so the perturbed oracle's spread, not the bf16 epsilon, is the floor a bound has to sit above.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import write_hf_checkpoint
from lucegen.model.reference import F32, Reference


class PerturbedReference(Reference):
    """The rounded oracle with each projection input multiplied by (1 + 2^-23 * N(0, 1)) before its rounding."""

    def __init__(self, *args, seed: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng = np.random.default_rng(seed)

    def _norm_in(self, x, w, weight):
        x = (x * (1 + 2.0 ** -23 * self.rng.standard_normal(x.shape))).astype(F32)
        return super()._norm_in(x, w, weight)


def metrics(a, b) -> dict:
    """The GPU tests' metrics of run ``a`` against run ``b`` (each (last-row logits, state))."""
    (la, sa), (lb, sb) = a, b
    out = {"logits": float(np.abs(la - lb).max() / np.abs(lb).max()),
           "1-cos": 1.0 - float(la @ lb / (np.linalg.norm(la) * np.linalg.norm(lb)))}
    for x, y in zip(sa.layers, sb.layers):
        pairs = (("k", x.k, y.k), ("v", x.v, y.v)) if hasattr(x, "k") else \
            (("conv", x.conv, y.conv), ("recurrent", x.recurrent, y.recurrent))
        for name, p, q in pairs:
            out[name] = max(out.get(name, 0.0), float(np.abs(p - q).max() / max(np.abs(q).max(), 1e-30)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="checkpoint directory, or a preset name (written to a temporary directory)")
    ap.add_argument("--lengths", type=int, nargs="*", default=[])
    ap.add_argument("--random", type=int, default=0, help="also this many prompts of random length 1 .. 2000")
    ap.add_argument("--seeds", type=int, default=2, help="perturbations per prompt")
    args = ap.parse_args()
    path = Path(args.model)
    if not path.is_dir():
        path = Path("/tmp/lucegen-oracle-floor") / args.model
        if not (path / "config.json").exists():
            write_hf_checkpoint(ModelConfig.preset(args.model), path, seed=0, progress=False)
    ckpt = load_checkpoint(str(path))
    cfg = ckpt.config
    rounded, exact = Reference(cfg, ckpt, gemm_inputs="bf16"), Reference(cfg, ckpt)
    rng = np.random.default_rng(0)
    prompts = [(n, n) for n in args.lengths] + [(int(rng.integers(1, 2001)), int(rng.integers(0, 2**16)))
                                                  for _ in range(args.random)]
    worst: dict[str, dict[str, float]] = {"perturbed vs rounded": {}, "rounded vs f32": {}}

    def run(ref, tokens):
        state = ref.new_state(tokens.size)
        return ref.forward(tokens, state, logits="last")[0], state

    for length, seed in prompts:
        tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, length).astype(np.int32)
        base = run(rounded, tokens)
        rows = [("rounded vs f32", metrics(base, run(exact, tokens)))]
        for s in range(args.seeds):
            perturbed = PerturbedReference(cfg, ckpt, gemm_inputs="bf16", seed=s)
            rows.append(("perturbed vs rounded", metrics(run(perturbed, tokens), base)))
        for label, m in rows:
            print(f"T={length:5d} seed={seed:5d} {label:21s} " + " ".join(f"{k}={v:.2e}" for k, v in m.items()),
                  flush=True)
            for k, v in m.items():
                worst[label][k] = max(worst[label].get(k, 0.0), v)
    for label, m in worst.items():
        print(f"worst {label:21s} " + " ".join(f"{k}={v:.2e}" for k, v in m.items()))


if __name__ == "__main__":
    main()

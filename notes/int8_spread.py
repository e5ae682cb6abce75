"""How far the int8-activation Reference moves from itself when a few of its int8 codes sit one step away: the
measurement behind INT8_BOUNDS (tests/gpu/test_tree_verify.py). CPU only; needs the gguf package.

    python notes/int8_spread.py [--flip 0.01] [--prompts 30] [--draws 6]

A code is moved to its neighbour where its input sits within 2% of a step from a tie, with probability --flip: what
an input a float ulp away from the Reference's (the device's summation order) does. For random prompts of 1-300
tokens, the root token's slot (the prompt's argmax, as the device's verify takes it) is run with and without flips;
printed: the logits' rel / cos (tests/gpu/gpu_models.py compare) and the states' worst relative error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from gpu_models import compare, gguf_file, state_errors  # noqa: E402

from lucegen.model import reference  # noqa: E402
from lucegen.model.checkpoint import load_checkpoint  # noqa: E402
from lucegen.model.quant import Q8_ACT_BLOCK, q8_activation_scales  # noqa: E402

K_QUANTS = {"Q4_K", "Q5_K", "Q6_K"}  # the groups that take int8 activations (lucegen/runtime/quant_target.py)


def flipped_q8(rng: np.random.Generator, p: float):
    """quant.q8_dequantized with a code one step off wherever its input is within 2% of a tie, with probability p."""
    def q8_dequantized(x):
        x = np.asarray(x, np.float32)
        inv = q8_activation_scales(x)
        t = x.reshape(*inv.shape, Q8_ACT_BLOCK) * inv[..., None]
        q = np.rint(t)
        flip = (np.abs(t - np.floor(t) - 0.5) < 0.02) & (rng.random(t.shape) < p)
        q = np.clip(np.where(flip, np.where(q > t, q - 1, q + 1), q), -127, 127)
        da = (np.float32(1) / np.where(inv == 0, 1, inv)).astype(np.float32)
        return (q * da[..., None]).astype(np.float32).reshape(x.shape)
    return q8_dequantized


def states(state) -> dict:
    return {"layers": [{"conv": l.conv, "recurrent": l.recurrent} if hasattr(l, "conv") else {"k": l.k, "v": l.v}
                       for l in state.layers]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flip", type=float, default=0.01)
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--draws", type=int, default=6)
    args = ap.parse_args()
    ck = load_checkpoint(str(gguf_file("tiny-q")))
    cfg = ck.config
    lm_head = "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    int8 = {name for name, shape in cfg.tensor_shapes().items() if len(shape) == 2 and
            name not in (lm_head, "embed_tokens.weight") and ck.gguf_tensor(name)[0].type_name in K_QUANTS}
    ref = reference.Reference(cfg, ck, gemm_inputs="fp16", int8_inputs=int8)
    rel, cos, state = [], [], []
    rng = np.random.default_rng(0)
    for _ in range(args.prompts):
        prompt = rng.integers(0, cfg.vocab_size, int(rng.integers(1, 301)))
        base = ref.new_state(512)
        root = int(np.argmax(ref.forward(prompt, base, logits="last")[0]))
        want = ref.forward([root], base, logits="last")[0]
        for _ in range(args.draws):
            with mock.patch.object(reference, "q8_dequantized", flipped_q8(rng, args.flip)):
                s = ref.new_state(512)
                ref.forward(prompt, s, logits="none")
                got = ref.forward([root], s, logits="last")[0]
            c = compare(got, want)
            rel.append(c["rel"])
            cos.append(c["cos"])
            state.append(max(v[0] for v in state_errors(states(s), base).values()))
    q = lambda a, qs: " / ".join(f"{v:.3f}" for v in np.quantile(a, qs))  # noqa: E731
    print(f"{args.prompts} prompts x {args.draws} draws, flip {args.flip}: logits rel {q(rel, [.5, .99, 1])} "
          f"(median / 99% / max), cos {np.quantile(cos, .01):.4f} / {min(cos):.4f} (1% / min); "
          f"states {q(state, [.5, .99, 1])}")


if __name__ == "__main__":
    main()

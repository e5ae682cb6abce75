"""How far the int8-activation oracle disagrees with itself: the noise floor under INT8_BOUNDS
(tests/gpu/test_tree_verify.py). CPU only; needs the gguf package.

    python experiments/int8_floor.py [--flip 0.01] [--prompts 30] [--draws 6]
    python experiments/int8_floor.py --faults [--prompts 8]

The oracle is ``Reference(gemm_inputs="fp16", int8_inputs=...)`` on a random ``tiny-q`` Q4_K_M GGUF, as the GPU tests
hold the quantised target to it. A code is moved to its neighbour where its input sits within 2% of a step from a tie,
with probability --flip: what an input a float ulp away from the oracle's (the device's summation order) does. For
random prompts of 1-300 tokens the root token's slot (the prompt's argmax, as the device's verify takes it) is run
with and without flips; printed: the logits' max |err| / max |ref| and cosine, and the states' worst relative error
(experiments/oracle_floor.py metrics: as the GPU tests count them). ``--faults`` prints instead what one fault in one
int8 input of the root slot's pass moves its logits by: what bounds at that floor cannot tell from rounding.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np

from lucegen.model import reference
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.config import ModelConfig
from lucegen.model.init_gguf import write_gguf_checkpoint
from lucegen.model.quant import Q8_ACT_BLOCK, q8_activation_scales
from lucegen.runtime.host_device import HostDevice
from lucegen.runtime.quant_target import QuantDecoder
from lucegen.target import load_target
from oracle_floor import metrics  # experiments/: the GPU tests' metrics of one run against another

reference_q8 = reference.q8_dequantized


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


def faulty_q8(kind: str, at: int):
    """quant.q8_dequantized with one fault in its ``at``-th call: the first 256 values' block doubled, zeroed or
    rotated by one value (a wrong scale, a lost block, a misplaced load in one layer's input)."""
    calls = [0]

    def q8_dequantized(x):
        y = reference_q8(x)
        calls[0] += 1
        if calls[0] == at:
            block = y.reshape(-1, Q8_ACT_BLOCK)[0]
            block[:] = {"scale x2": 2 * block, "zeroed": 0 * block, "rotated": np.roll(block, 1)}[kind]
        return y
    return q8_dequantized


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flip", type=float, default=0.01)
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--faults", action="store_true",
                    help="instead: what one fault in one int8 input of the root slot's pass does to its logits")
    args = ap.parse_args()
    path = Path(tempfile.mkdtemp()) / "tiny-q.gguf"
    write_gguf_checkpoint(ModelConfig.preset("tiny-q"), path, quant="q4_k_m", seed=0, progress=False)
    ck = load_checkpoint(str(path))
    cfg = ck.config
    # the weights whose inputs the quantised target rounds to int8, as it chooses them (on the host stand-in device)
    target = load_target("sm_90").quantised_target()
    int8 = QuantDecoder(str(path), device=HostDevice(target), max_context=512).int8_weights
    ref = reference.Reference(cfg, ck, gemm_inputs="fp16", int8_inputs=int8)
    rel, cos, state = [], [], []
    rng = np.random.default_rng(0)
    if args.faults:
        print_faults(ref, cfg, rng, args.prompts)
        return
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
            m = metrics((got, s), (want, base))
            rel.append(m["logits"])
            cos.append(1.0 - m["1-cos"])
            state.append(max(v for k, v in m.items() if k not in ("logits", "1-cos")))
    q = lambda a, qs: " / ".join(f"{v:.3f}" for v in np.quantile(a, qs))  # noqa: E731
    print(f"{args.prompts} prompts x {args.draws} draws, flip {args.flip}: logits rel {q(rel, [.5, .99, 1])} "
          f"(median / 99% / max), cos {np.quantile(cos, .01):.4f} / {min(cos):.4f} (1% / min); "
          f"states {q(state, [.5, .99, 1])}")


def print_faults(ref, cfg, rng: np.random.Generator, prompts: int) -> None:
    """Per fault kind and place (the int8 inputs of the root slot's pass, in order: the first layer's to the last's),
    the logits' rel / cos against the faultless pass, over ``prompts`` random prompts (min .. max)."""
    runs = []
    for _ in range(prompts):
        prompt = rng.integers(0, cfg.vocab_size, int(rng.integers(1, 301)))
        state = ref.new_state(512)
        root = int(np.argmax(ref.forward(prompt, state, logits="last")[0]))
        runs.append((state, root, ref.forward([root], state.copy(), logits="last")[0]))
    calls = [0]

    def counted(x):
        calls[0] += 1
        return reference_q8(x)
    with mock.patch.object(reference, "q8_dequantized", counted):
        ref.forward([runs[0][1]], runs[0][0].copy(), logits="none")
    n = calls[0]
    for kind in ("scale x2", "zeroed", "rotated"):
        for at in (1, n // 4, n // 2, 3 * n // 4, n):
            rel, cos = [], []
            for state, root, want in runs:
                with mock.patch.object(reference, "q8_dequantized", faulty_q8(kind, at)):
                    got = ref.forward([root], state.copy(), logits="last")[0]
                m = metrics((got, state), (want, state))  # the logits alone: the states are not compared here
                rel.append(m["logits"])
                cos.append(1.0 - m["1-cos"])
            print(f"{kind:8} at int8 input {at:2} of {n}: logits rel {min(rel):.3f} .. {max(rel):.3f}, "
                  f"cos {min(cos):.4f} .. {max(cos):.4f}")


if __name__ == "__main__":
    main()

"""Where each phase of the decode megakernel spends its time, measured from the moment the previous phase's last
block finished (t = 0), over every block: when blocks start the phase, when their inputs arrive (thread 0's
await), when the whole block has staged them, when they finish; and the phase's critical-path time.

On the device (tg128 after a 32-token prompt, profiled; also saves OUT_DIR/timeline.npz with the raw stamps
[steps, phases, blocks, 4] in ns and the layer kinds):

    python -m lucegen.devtools.megakernel_timeline MODEL_DIR OUT_DIR

Anywhere, from a saved file:

    python -m lucegen.devtools.megakernel_timeline --load OUT_DIR/timeline.npz
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from lucegen.bench.decode import phase_names

# phases whose blocks stamp no input arrival or staging (their awaits are per column / per head)
UNSTAMPED = ("delta_rule", "attention")


def record(model: str, out: str) -> tuple[np.ndarray, np.ndarray]:
    from lucegen.model.checkpoint import load_checkpoint
    from lucegen.runtime.device import Device
    from lucegen.runtime.megakernel import MegakernelDecoder

    ckpt = load_checkpoint(model)
    dev = Device.open()
    prompt = np.random.default_rng(0).integers(0, ckpt.config.vocab_size, 32).astype(np.int32)
    dec = MegakernelDecoder(ckpt, device=dev, max_context=200, profile=True)
    dec.prefill(prompt)
    snap = dec.snapshot()
    first = dec.next_token
    for _ in range(2):  # the second launch is timed warm
        dec.restore(snap)
        dec.launch([first], 128)
        res = dec.collect()
    kinds = np.array([l.kind for l in dec.layout.layers])
    np.savez_compressed(f"{out}/timeline.npz", stamps=res.profile, kinds=kinds)
    return res.profile, kinds


def report(stamps: np.ndarray, kinds: np.ndarray, skip: int = 8) -> None:
    s = stamps[skip:-skip].astype(np.int64)  # steady-state steps
    names = phase_names(list(kinds))
    start, arrive, staged, end = (s[..., i] for i in range(4))
    last = end.max(axis=2)  # [steps, phases]: when the phase's last block finished
    print("µs from the previous phase's last block (10th / 50th / 90th percentile over steps x blocks)")
    print(f"{'phase':13s} {'n':>3s} {'crit':>6s} | {'start':^17s} | {'inputs (t0)':^17s} | {'staged':^17s} | "
          f"{'end':^17s}")
    total = 0.0
    for name in dict.fromkeys(names[1:]):
        ps = [p for p in range(1, len(names)) if names[p] == name]
        rel = lambda x: np.concatenate([(x[:, p] - last[:, p - 1][:, None]).ravel() for p in ps]) / 1e3  # noqa: E731
        crit = float(np.mean([(last[:, p] - last[:, p - 1]).mean() for p in ps])) / 1e3
        total += crit * len(ps)
        pct = lambda x: " ".join(f"{v:5.2f}" for v in np.percentile(x, [10, 50, 90]))  # noqa: E731
        cols = [pct(rel(start))]
        cols += ["(not stamped)".center(17) if name in UNSTAMPED else pct(rel(x)) for x in (arrive, staged)]
        cols.append(pct(rel(end)))
        print(f"{name:13s} {len(ps):3d} {crit:6.2f} | " + " | ".join(cols))
    print(f"critical path per token (phases 1..): {total:.1f} µs")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lucegen.devtools.megakernel_timeline",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a BF16 checkpoint directory (on the device)")
    ap.add_argument("out", nargs="?", help="the directory to save timeline.npz into")
    ap.add_argument("--load", metavar="NPZ", help="report a saved timeline.npz instead (no GPU)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.load:
        if args.model or args.out:
            ap.error("--load takes no MODEL_DIR / OUT_DIR")
        data = np.load(args.load)
        report(data["stamps"], data["kinds"])
    elif args.model and args.out:
        report(*record(args.model, args.out))
    else:
        ap.error("give MODEL_DIR and OUT_DIR, or --load NPZ")
    return 0


if __name__ == "__main__":
    sys.exit(main())

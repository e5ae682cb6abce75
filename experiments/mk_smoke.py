"""A short megakernel run on the tiny preset (for compute-sanitizer): prefill 12 tokens and generate 8, then a
longer context whose attention splits each head's keys over blocks (prefill 130 tokens, generate 4)."""
import tempfile
from pathlib import Path

from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import write_hf_checkpoint
from lucegen.runtime.megakernel import MegakernelDecoder

out = Path(tempfile.gettempdir()) / "lucegen-mk-smoke"
if not (out / "config.json").exists():
    write_hf_checkpoint(ModelConfig.preset("tiny"), out, seed=0, progress=False)
for prompt, gen in ((12, 8), (130, 4)):
    dec = MegakernelDecoder(out, max_context=prompt + gen + 1)
    dec.prefill([1 + i % 500 for i in range(prompt)])
    print("generated", dec.generate(gen))
    dec.close()

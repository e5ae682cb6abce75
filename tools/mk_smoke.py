"""A short megakernel run on the tiny preset (for compute-sanitizer): prefill 12 tokens, generate 8."""
import tempfile
from pathlib import Path

from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import write_hf_checkpoint
from lucegen.runtime.megakernel import MegakernelDecoder

out = Path(tempfile.gettempdir()) / "lucegen-mk-smoke"
if not (out / "config.json").exists():
    write_hf_checkpoint(ModelConfig.preset("tiny"), out, seed=0, progress=False)
dec = MegakernelDecoder(out, max_context=32)
dec.prefill(list(range(1, 13)))
print("generated", dec.generate(8))
dec.close()

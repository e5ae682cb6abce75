"""One view of a model's weights, whatever file they came from.

``load_checkpoint(path)`` reads a HF directory (``config.json`` + ``*.safetensors``, sharded with
``model.safetensors.index.json`` or not; the text-only ``Qwen3_5ForCausalLM`` layout with ``model.`` prefixes or the
official multimodal ``Qwen3_5ForConditionalGeneration`` layout with ``model.language_model.``, whose vision tower and
MTP head are skipped; a ModelOpt NVFP4 directory through :mod:`lucegen.model.nvfp4_checkpoint`) or a ``.gguf`` file (:mod:`lucegen.model.gguf_io`). Tensors are exposed under internal names:
HF text-model names without prefix (``embed_tokens.weight``, ``layers.3.self_attn.q_proj.weight``, ...; see
:meth:`ModelConfig.tensor_shapes`), every one checked for presence and shape before anything is returned.
A DFlash draft directory (its config.json has ``dflash_config`` / a ``DFlash*`` architecture) loads through
:func:`lucegen.model.dflash.load_dflash_directory`: same checkpoint class, ``config`` a ``DFlashConfig``;
``load_dflash(path)`` opens a draft's directory or GGUF file. The checkpoint classes are
:mod:`lucegen.model.checkpoint_base`'s and :mod:`lucegen.model.gguf_io`'s.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import CheckpointError
from . import dflash  # a DFlash draft directory: its own config and tensor names
from .checkpoint_base import Checkpoint, SafetensorsCheckpoint, read_safetensors_directory
from .config import ModelConfig
from .dflash_gguf import TargetFacts, check_rope, is_gguf, load_dflash_gguf
from .gguf_io import load_gguf
from .nvfp4_checkpoint import QUANT_ALGOS, load_nvfp4_directory, quant_algo

# (prefix in the file, what it means): the first matching prefix decides
HF_PREFIXES = (
    ("model.language_model.", "text"),  # Qwen3_5ForConditionalGeneration
    ("model.visual.", "skip"),  # vision tower
    ("mtp.", "skip"),  # multi-token-prediction head (unused)
    ("model.mtp.", "skip"),
    ("model.", "text"),  # Qwen3_5ForCausalLM
    ("lm_head.", "lm_head"),
)


def load_checkpoint(path) -> Checkpoint:
    """A HF directory (or one of its .safetensors files / its config.json) or a .gguf file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF" or path.suffix == ".gguf":
            return load_gguf(path)
        if path.suffix in (".safetensors", ".json"):
            return load_hf_directory(path.parent)
        raise CheckpointError(f"{path}: neither a GGUF file nor part of a HF safetensors directory")
    return load_hf_directory(path)


def internal_name(stored: str) -> str | None:
    """HF name in the file -> internal name; None for tensors to skip (vision tower, MTP head)."""
    for prefix, kind in HF_PREFIXES:
        if stored.startswith(prefix):
            if kind == "skip":
                return None
            if kind == "lm_head":
                return stored
            return stored[len(prefix):]
    return stored  # unprefixed: reported as unexpected below unless it is an internal name


def load_hf_directory(directory) -> SafetensorsCheckpoint:
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: no config.json")
    config_json = dflash.read_json(config_path)
    if dflash.is_dflash_config(config_json):
        return dflash.load_dflash_directory(directory)
    algo = quant_algo(directory, config_json)
    if algo not in (None, *QUANT_ALGOS):
        raise CheckpointError(f"{directory}: ModelOpt quant_algo {algo!r}: lucegen reads the NVFP4 ones only "
                              f"({', '.join(QUANT_ALGOS)})")
    config = ModelConfig.from_file(config_path)
    expected = config.tensor_shapes()

    def internal(stored: str, path: Path) -> str | None:
        name = internal_name(stored)
        if name is None or (name == "lm_head.weight" and config.tie_word_embeddings):
            return None  # not a text-model tensor; or tied: the embedding is the head
        if name not in expected:
            raise CheckpointError(f"{path}: unexpected tensor {stored!r} for this config "
                                  f"({config.num_layers} layers, {_layer_kind(name, config)})")
        return name

    if algo in QUANT_ALGOS:
        return load_nvfp4_directory(directory, config, internal)
    return read_safetensors_directory(directory, config, internal, "tensor")


def _layer_kind(name: str, config: ModelConfig) -> str:
    m = re.match(r"layers\.(\d+)\.", name)
    if m and int(m.group(1)) < config.num_layers:
        return f"layer {m.group(1)} is {config.layer_types[int(m.group(1))]}"
    return "no such tensor in a Qwen3.5 text model"


#: The mask token of the Qwen3.5 / Qwen3.6 vocabulary (248320 tokens): lucebox-hub's default target mask token
#: (dflash27b.h DFLASH27B_DRAFT_MASK_TOKEN_ID, "Qwen tokenizer's mask token"), which z-lab's drafts name too.
QWEN35_VOCAB_SIZE, QWEN35_MASK_TOKEN_ID = 248320, 248070


def target_facts(checkpoint) -> TargetFacts:
    """What a draft may take from the target ``checkpoint``: depth, vocabulary, RoPE base and mask token (a GGUF's
    ``tokenizer.ggml.mask_token_id``, else the Qwen3.5 vocabulary's as lucebox-hub's loader defaults to it)."""
    c = checkpoint.config
    mask = None
    meta = getattr(getattr(checkpoint, "file", None), "metadata", None) or {}
    if isinstance(meta.get("tokenizer.ggml.mask_token_id"), int):
        mask = meta["tokenizer.ggml.mask_token_id"]
    elif c.vocab_size == QWEN35_VOCAB_SIZE:
        mask = QWEN35_MASK_TOKEN_ID
    return TargetFacts(c.num_layers, c.vocab_size, c.rope_theta, mask)


def load_dflash(path, vocab_size: int | None = None, target: TargetFacts | None = None):
    """A draft from its HF directory (config.json + safetensors) or a GGUF file (:mod:`lucegen.model.dflash_gguf`;
    ``vocab_size`` or ``target`` (:func:`target_facts`) for what a GGUF leaves to its target; beside a target, a GGUF
    whose rope.freq_base differs from the target's is warned about)."""
    if is_gguf(path):
        ck = load_dflash_gguf(path, vocab_size, target)
        if target is not None:
            check_rope(ck.config, target.rope_theta, path)
        return ck
    if Path(path).is_file():
        raise CheckpointError(f"{path}: a DFlash draft is a directory (config.json + safetensors) or a GGUF file")
    return dflash.load_dflash_directory(path)

"""A tiny but real diffusers Stable Diffusion pipeline with random weights (about 7 MB): it runs
every code path of a real model in a fraction of a second and draws noise. Nothing is downloaded:
the tokenizer is built from a vocabulary written here."""

from __future__ import annotations

import json
import os
import shutil
import string
import tempfile
from pathlib import Path

from .models import RANDOM_WEIGHTS_MARK

SEED = 0  # the same weights on every build


def _vocab() -> dict[str, int]:
    # CLIP's special tokens at the ids the text encoder's config names, then one token per
    # letter and digit, alone and word-final: enough for any lower-case prompt.
    vocab = {"<|startoftext|>": 0, "!": 1, "<|endoftext|>": 2}
    for c in string.ascii_lowercase + string.digits:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return vocab


def _build(dest: Path) -> None:
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from .engine import quiet_libraries

    quiet_libraries()
    torch.manual_seed(SEED)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=32,
    )
    vae = AutoencoderKL(
        block_out_channels=[32, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        norm_num_groups=32,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=2,
            hidden_size=32,
            intermediate_size=37,
            layer_norm_eps=1e-5,
            num_attention_heads=4,
            num_hidden_layers=2,
            pad_token_id=1,
            vocab_size=1000,
        )
    )
    with tempfile.TemporaryDirectory() as tok_dir:
        vocab, merges = Path(tok_dir, "vocab.json"), Path(tok_dir, "merges.txt")
        vocab.write_text(json.dumps(_vocab()))
        merges.write_text("#version: 0.2\n")
        tokenizer = CLIPTokenizer(str(vocab), str(merges), model_max_length=77)
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,  # what diffusers expects of SD 1.x configs; 0 draws a warning
    )
    pipe = StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(str(dest))


def _world_readable(root: Path) -> None:
    # The model store is read by every user's account; safetensors are written 0600.
    root.chmod(0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            Path(dirpath, d).chmod(0o755)
        for f in filenames:
            Path(dirpath, f).chmod(0o644)


def make_tiny_model(dest: Path) -> list[tuple[Path, int]]:
    """Build the pipeline into ``dest`` (which must not exist), atomically: a reader sees no
    folder or the whole model. Returns each file written and its size."""
    dest = dest.absolute()
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; remove it first")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp-", dir=dest.parent))
    try:
        _build(tmp)
        (tmp / RANDOM_WEIGHTS_MARK).write_text(
            "This pipeline was built by gpulab with random weights: it draws noise, not your "
            "prompt. It proves the launch path end to end.\n"
        )
        _world_readable(tmp)
        # rename() of a folder fails when dest appeared meanwhile and is not empty.
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [(p, p.stat().st_size) for p in sorted(dest.rglob("*")) if p.is_file()]

"""MusicGen as it ships, minus its codec: the teacher every learning check measures the adapter against.

`load_musicgen_teacher` loads the parts that read text and codes (the decoder, the T5 encoder, `enc_to_dec_proj`)
and the text tokenizer; EnCodec is never built. Its null condition (CFG's unconditional branch) is zero
cross-attention input with mask 0. `MusicgenTeacher.condition` is tested equal to the composite model's text path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import (
    AutoTokenizer,
    MusicgenForCausalLM,
    PreTrainedTokenizerBase,
    T5Config,
    T5EncoderModel,
)
from transformers.utils import cached_file

from adapter_trainer.errors import UserError
from adapter_trainer.model.builders import (
    _resolve_dtype,
    config_dict,
    load_composite_part,
    load_musicgen_decoder,
    source_kwargs,
)

PROJ_PREFIX = "enc_to_dec_proj."


class TeacherUnavailable(UserError, ValueError):
    """The audio LM checkpoint has no text encoder (a decoder-only checkpoint): the message says what it lacks."""


@dataclass
class MusicgenTeacher:
    """MusicGen with its own text encoder: decoder + T5 encoder + projection + the T5 tokenizer (no codec)."""

    decoder: MusicgenForCausalLM
    text_encoder: T5EncoderModel
    enc_to_dec_proj: nn.Linear | None  # None when T5's width equals the decoder's (transformers then has none)
    tokenizer: PreTrainedTokenizerBase
    source: str  # the checkpoint as given (model.audio_lm)

    def to(self, device: torch.device | str) -> MusicgenTeacher:
        self.decoder.to(device)
        self.text_encoder.to(device)
        if self.enc_to_dec_proj is not None:
            self.enc_to_dec_proj.to(device)
        return self

    def eval(self) -> MusicgenTeacher:
        for m in (self.decoder, self.text_encoder, self.enc_to_dec_proj):
            if m is not None:
                m.eval()
        return self

    @torch.no_grad()
    def condition(self, texts: list[str], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> (encoder_hidden_states [B, T, d_decoder], encoder_attention_mask [B, T] long), as the composite
        model feeds its decoder: T5 states, projected, multiplied by the mask. An empty caption is MusicGen's exact
        null: zero states with mask 0 over every position."""
        return self.project(*self.encode_text(texts, device))

    @torch.no_grad()
    def encode_text(self, texts: list[str], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """The frozen half of `condition`: captions -> (T5 states [B, T, d_text], encoder_attention_mask [B, T] long,
        0 over every position of an empty caption)."""
        enc = self.tokenizer(texts, padding=True, return_tensors="pt").to(device)
        mask = enc["attention_mask"] * torch.tensor([bool(t) for t in texts], device=device, dtype=torch.long)[:, None]
        states = self.text_encoder(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        return states, mask

    def project(self, states: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The other half: T5 states [B, T, d_text] -> `enc_to_dec_proj` -> times the mask [B, T] -> (states [B, T,
        d_decoder], mask). Differentiable (the demo MusicGen's pretraining trains the projection through it)."""
        if self.enc_to_dec_proj is not None:
            states = self.enc_to_dec_proj(states.to(self.enc_to_dec_proj.weight.dtype))  # [B, T, d_decoder]
        return states.to(self.decoder.dtype) * mask[..., None].to(self.decoder.dtype), mask


def load_musicgen_teacher(name_or_path: str | os.PathLike, dtype: torch.dtype | str = torch.float32) -> MusicgenTeacher:
    """The teacher out of a `facebook/musicgen-small`-layout checkpoint; TeacherUnavailable for one without a text
    encoder or tokenizer. The T5 encoder runs in float32 whatever `dtype` says (T5 overflows in float16)."""
    src = str(name_or_path)
    found = config_dict(name_or_path, "MusicGen", "MusicGen config")
    if found.get("model_type") != "musicgen" or "text_encoder" not in found:
        raise TeacherUnavailable(
            f"model.audio_lm={src!r} is a {found.get('model_type')!r} checkpoint without a text encoder, so "
            f"MusicGen with its own captions cannot be scored; use a facebook/musicgen-small-layout checkpoint "
            f"(decoder + text_encoder + enc_to_dec_proj) or set trainer.eval_teacher=false"
        )
    t5 = dict(found["text_encoder"])
    t5.pop("model_type", None)
    decoder = load_musicgen_decoder(src, dtype)
    t5_config = T5Config(**t5)
    text_encoder, info = load_composite_part(T5EncoderModel, "text_encoder", src, config=t5_config, dtype=torch.float32)
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise TeacherUnavailable(
            f"{len(missing)} text-encoder tensors are missing from {src!r} (first: {missing[:4]}); it holds no "
            f"trained T5 (rebuild the demo models with `make demo-models`, or set trainer.eval_teacher=false)"
        )
    try:
        # config=: the tokenizer's class comes from tokenizer_config.json or T5's config, never from the composite
        # config.json, whose loading would import transformers' EnCodec modules into this codec-free process
        tokenizer = AutoTokenizer.from_pretrained(src, config=t5_config, **source_kwargs(src))
    except (OSError, ValueError, TypeError) as e:  # no tokenizer files: transformers raises any of these
        reason = " ".join(str(e).split())
        raise TeacherUnavailable(
            f"{src!r} has no text tokenizer for its T5 ({reason}); copy the checkpoint's tokenizer files next to "
            f"its config.json (facebook/musicgen-small ships them), or set trainer.eval_teacher=false"
        ) from e
    d_text, d_dec = text_encoder.config.d_model, decoder.config.hidden_size
    needs_proj = d_text != d_dec and decoder.config.cross_attention_hidden_size is None
    proj = _load_projection(src, d_text, d_dec) if needs_proj else None
    teacher = MusicgenTeacher(decoder, text_encoder, proj, tokenizer, src)
    decoder.requires_grad_(False)
    text_encoder.requires_grad_(False)
    if proj is not None:
        proj.requires_grad_(False)
        proj.to(_resolve_dtype(dtype))
    return teacher.eval()


def _load_projection(src: str, d_text: int, d_dec: int) -> nn.Linear:
    """`enc_to_dec_proj` (Linear(d_text, d_dec), with bias) read from the checkpoint's safetensors (sharded or not)."""
    files = _weight_files(src)
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(f, framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                if k.startswith(PROJ_PREFIX):
                    tensors[k[len(PROJ_PREFIX) :]] = st.get_tensor(k)
    proj = nn.Linear(d_text, d_dec)
    if set(tensors) != {"weight", "bias"} or tuple(tensors["weight"].shape) != (d_dec, d_text):
        raise TeacherUnavailable(
            f"{src!r} holds no enc_to_dec_proj of shape ({d_dec}, {d_text}) (found {sorted(tensors)}); it is not a "
            f"complete MusicGen text path (set trainer.eval_teacher=false, or rebuild with `make demo-models`)"
        )
    proj.load_state_dict({k: v.float() for k, v in tensors.items()})
    return proj


def _weight_files(src: str) -> list[str]:
    """The checkpoint's safetensors files: the index's shards, else model.safetensors (local dir or hub cache)."""
    index = cached_file(src, "model.safetensors.index.json", _raise_exceptions_for_missing_entries=False)
    if index is not None:
        names = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
        return [cached_file(src, n) for n in names]
    return [cached_file(src, "model.safetensors")]

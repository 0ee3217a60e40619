"""Model builders: literal-size configs, the tower loaders, and `build_mot_model` (training and generation).

Only MusicGen's decoder is ever built, never its T5 text encoder or EnCodec: this process sees integer codes.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MusicgenConfig,
    MusicgenDecoderConfig,
    MusicgenForCausalLM,
    PreTrainedConfig,
    PreTrainedTokenizerBase,
)

from adapter_trainer.config import ConfigError, ModelConfig, MoTConfig
from adapter_trainer.data.token_layout import AudioVocab
from adapter_trainer.model.hub_source import ModelSourceError, cache_only
from adapter_trainer.model.mot import MoTAdapterModel
from adapter_trainer.model.musicgen_rows import MusicgenRowsMoT

OFFLINE_HINT = (
    "Pass a local directory that holds the checkpoint (e.g. model.llm=/path/to/Llama-3.2-1B "
    "model.audio_lm=/path/to/musicgen-small), get the Hub's files with `hf download <id>` (docs/real-data.md), or "
    "use the offline demo models (`make demo-models`, then +experiment=demo)."
)

# facebook/musicgen-small stores the decoder as `decoder.model.decoder.*` / `decoder.lm_heads.*` next to
# `text_encoder.*`, `audio_encoder.*` and `enc_to_dec_proj.*`; each part's model class expects the key after its prefix.
MUSICGEN_COMPOSITE_PARTS = ("decoder", "text_encoder", "audio_encoder", "enc_to_dec_proj")


def load_composite_part(
    cls: type, part: str, name_or_path: str | os.PathLike, **kwargs: Any
) -> tuple[torch.nn.Module, dict]:
    """(model, loading info) of one part of a composite MusicGen checkpoint, its `part.` prefix stripped.

    The other parts' prefixes join `_keys_to_ignore_on_load_unexpected` for the call: transformers would list
    each of their tensors as UNEXPECTED. A failed load is an OSError naming the part and the fix."""
    others = "|".join(p for p in MUSICGEN_COMPOSITE_PARTS if p != part)
    saved = cls.__dict__.get("_keys_to_ignore_on_load_unexpected", None)
    inherited = getattr(cls, "_keys_to_ignore_on_load_unexpected", None)
    cls._keys_to_ignore_on_load_unexpected = {*(inherited or ()), rf"^({others})\."}
    try:
        mapping = {rf"^{part}\.": ""}
        return cls.from_pretrained(
            str(name_or_path), output_loading_info=True, key_mapping=mapping, **kwargs, **source_kwargs(name_or_path)
        )
    except OSError as e:
        raise _not_available(f"MusicGen {part.replace('_', ' ')}", name_or_path, e) from e
    finally:
        if saved is None and "_keys_to_ignore_on_load_unexpected" in cls.__dict__:
            del cls._keys_to_ignore_on_load_unexpected
        else:
            cls._keys_to_ignore_on_load_unexpected = saved


def llama3_2_1b_config() -> LlamaConfig:
    """Llama 3.2 1B sizes (shape documentation and tests; the weights come from `load_llm`)."""
    return _llama_config(hidden_size=2048, intermediate_size=8192, layers=16, heads=32, kv_heads=8, head_dim=64)


def tiny_llama_config() -> LlamaConfig:
    """A tiny Llama 3.2-shaped model with the REAL Llama 3 vocabulary (128,256 ids), for the demo and tests."""
    return _llama_config(hidden_size=128, intermediate_size=512, layers=4, heads=4, kv_heads=2, head_dim=32)


def _llama_config(
    *, hidden_size: int, intermediate_size: int, layers: int, heads: int, kv_heads: int, head_dim: int
) -> LlamaConfig:
    """Llama 3.2's layout (the real tokenizer's 128,256 ids, tied embeddings, llama3 rope) at the given sizes."""
    return LlamaConfig(
        vocab_size=128_256,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=131_072,
        rms_norm_eps=1e-5,
        rope_parameters=_llama3_rope(),
        tie_word_embeddings=True,
        bos_token_id=128_000,
        eos_token_id=128_001,
        attention_bias=False,
        mlp_bias=False,
    )


class MusicgenSpecialIdsFilter(logging.Filter):
    """Drops transformers' two warnings that MusicGen's pad and bos ids (2048) lie outside its vocabulary: the
    embedding tables have one row more than the 2048 codes, and 2048 is that pad / decoder-start row."""

    PATTERN = re.compile(r"Model config: (pad|bos)_token_id must be .*\(between 0 and 2047\), got 2048\.")

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.PATTERN.match(record.getMessage())


_CONFIG_LOGGER = logging.getLogger("transformers.configuration_utils")  # where transformers logs that check
if not any(isinstance(f, MusicgenSpecialIdsFilter) for f in _CONFIG_LOGGER.filters):
    _CONFIG_LOGGER.addFilter(MusicgenSpecialIdsFilter())


def tiny_musicgen_decoder_config() -> MusicgenDecoderConfig:
    """A tiny MusicGen decoder: 4 codebooks x 2048 codes (like musicgen-small), hidden 64, 6 layers, 4 heads, ffn 256."""
    return _musicgen_decoder_config(
        hidden_size=64, num_hidden_layers=6, num_attention_heads=4, ffn_dim=256, dropout=0.0
    )


def _musicgen_decoder_config(
    *, hidden_size: int, num_hidden_layers: int, num_attention_heads: int, ffn_dim: int, dropout: float
) -> MusicgenDecoderConfig:
    """musicgen-small's decoder layout (4 codebooks x 2048 codes, pad/bos id 2048, mono, gelu) at the given sizes."""
    return MusicgenDecoderConfig(
        vocab_size=2048,  # C
        num_codebooks=4,  # K
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        ffn_dim=ffn_dim,
        max_position_embeddings=2048,
        activation_function="gelu",
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=2048,
        bos_token_id=2048,
        audio_channels=1,
    )


def _llama3_rope() -> dict:
    """Llama 3.2's rope: theta 500k with the "llama3" frequency scaling (factor 32, original context 8192)."""
    return {
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    }


def _resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """model.dtype (float32 | bfloat16 | float16, checked by config.validate_config) or a torch dtype."""
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)


# Copied from tokenizer_pipeline/codec/encode.py; tests/test_copies.py keeps them identical
def _looks_like_path(name_or_path: str | Path) -> bool:
    """A directory meant, not a Hub id: a Path, an absolute, relative or home path, more than one `/`, anything that
    exists here, or `a/b` where `a` is a directory here (`build/x` before it is built is a missing
    directory, not a Hub repository named `build/x`)."""
    s = str(name_or_path)
    first = s.split("/", 1)[0]
    return (
        isinstance(name_or_path, Path)
        or s.startswith((".", "/", "~"))
        or s.count("/") > 1
        or Path(s).exists()
        or ("/" in s and bool(first) and Path(first).is_dir())
    )


def _not_available(what: str, name_or_path: str | os.PathLike, err: Exception) -> OSError:
    if isinstance(err, ModelSourceError):  # the Hub and the cache were asked first: the cause and fix are named
        return OSError(f"{what}: {err}")
    local = Path(name_or_path).exists()
    where = "the local directory" if local else "the hub id"
    reason = " ".join(str(err).split())  # one line: the CLI prints the message as the whole refusal
    return OSError(f"could not load the {what} from {where} {str(name_or_path)!r}: {reason} {OFFLINE_HINT}")


def _check_source(what: str, name_or_path: str | os.PathLike) -> None:
    """A path that does not exist fails here, before transformers tries to read it as a hub id."""
    if _looks_like_path(name_or_path) and not Path(name_or_path).expanduser().is_dir():
        raise FileNotFoundError(f"{what} directory {str(name_or_path)!r} does not exist. {OFFLINE_HINT}")


def source_kwargs(name_or_path: str | os.PathLike) -> dict[str, bool]:
    """`from_pretrained` keywords: none for a local directory; for a Hub id, `local_files_only` as
    `hub_source.cache_only` decides (raises its ModelSourceError)."""
    if Path(name_or_path).expanduser().is_dir() or _looks_like_path(name_or_path):
        return {}
    return {"local_files_only": cache_only(str(name_or_path))}


def config_dict(name_or_path: str | os.PathLike, model: str, what: str) -> dict[str, Any]:
    """The checkpoint's config.json as a dict (no model built); `model` and `what` (the file) name it in the errors."""
    _check_source(model, name_or_path)
    try:
        return PreTrainedConfig.get_config_dict(str(name_or_path), **source_kwargs(name_or_path))[0]
    except OSError as e:
        raise _not_available(what, name_or_path, e) from e


def check_model_sources(model: ModelConfig) -> None:
    """Ask once about each tower named by a Hub id before anything loads; an unavailable one is a ConfigError."""
    for key, name in (("model.llm", model.llm), ("model.audio_lm", model.audio_lm)):
        try:
            source_kwargs(name)
        except ModelSourceError as e:
            raise ConfigError(f"{key}={name}: {e}") from e


def load_text_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The LLM's tokenizer (`AutoTokenizer.from_pretrained`); a hub id or a local directory."""
    _check_source("text tokenizer", name_or_path)
    try:
        return AutoTokenizer.from_pretrained(str(name_or_path), **source_kwargs(name_or_path))
    except OSError as e:
        raise _not_available("text tokenizer", name_or_path, e) from e


def load_llm(name_or_path: str | os.PathLike, dtype: torch.dtype | str = torch.float32) -> LlamaForCausalLM:
    """`LlamaForCausalLM` (sdpa attention) from a hub id or a local directory; OSError if unavailable,
    ValueError if not a Llama."""
    model_type = config_dict(name_or_path, "LLM", "LLM").get("model_type")
    if model_type != "llama":
        raise ValueError(
            f"model.llm={str(name_or_path)!r} is a {model_type!r} checkpoint; this trainer "
            f"needs a Llama (model_type 'llama', e.g. meta-llama/Llama-3.2-1B)"
        )
    try:
        return LlamaForCausalLM.from_pretrained(
            str(name_or_path), dtype=_resolve_dtype(dtype), attn_implementation="sdpa", **source_kwargs(name_or_path)
        )
    except OSError as e:
        raise _not_available("LLM", name_or_path, e) from e


def load_musicgen_decoder_config(name_or_path: str | os.PathLike) -> MusicgenDecoderConfig:
    """The decoder config out of a composite `musicgen` or a decoder-only `musicgen_decoder` config.json."""
    found = config_dict(name_or_path, "MusicGen", "MusicGen config")
    model_type = found.get("model_type")
    if model_type == MusicgenConfig.model_type:
        # MusicgenDecoderConfig.base_config_key is "decoder_config" but the composite stores "decoder": read it here.
        if "decoder" not in found:
            raise ValueError(f"composite musicgen config at {str(name_or_path)!r} has no 'decoder' entry")
        dec = dict(found["decoder"])
        dec.pop("model_type", None)
        return MusicgenDecoderConfig(**dec)
    if model_type == MusicgenDecoderConfig.model_type:
        return MusicgenDecoderConfig.from_dict(found)
    raise ValueError(
        f"model.audio_lm={str(name_or_path)!r} has model_type {model_type!r}; expected 'musicgen' "
        f"(facebook/musicgen-small layout) or 'musicgen_decoder' (decoder-only checkpoint)"
    )


def load_musicgen_decoder(
    name_or_path: str | os.PathLike, dtype: torch.dtype | str = torch.float32
) -> MusicgenForCausalLM:
    """Only MusicGen's decoder, from a composite or a decoder-only checkpoint; OSError if unavailable, ValueError
    naming missing or mis-shaped tensors."""
    decoder_config = load_musicgen_decoder_config(name_or_path)
    model, info = load_composite_part(
        MusicgenForCausalLM, "decoder", name_or_path, config=decoder_config, dtype=_resolve_dtype(dtype)
    )
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise ValueError(
            f"{len(missing)} MusicGen decoder tensors are missing from {str(name_or_path)!r} "
            f"(first: {missing[:8]}); expected a facebook/musicgen-small layout ('decoder.model.decoder.*', "
            f"'decoder.lm_heads.*') or a decoder-only MusicgenForCausalLM checkpoint"
        )
    mismatched = info.get("mismatched_keys", [])
    if mismatched:
        raise ValueError(
            f"MusicGen decoder tensors with the wrong shape in {str(name_or_path)!r}: {list(mismatched)[:8]}"
        )
    return model


def musicgen_small_decoder_config() -> MusicgenDecoderConfig:
    """facebook/musicgen-small's decoder sizes (shape documentation and the real-size benchmark)."""
    return _musicgen_decoder_config(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, ffn_dim=4096, dropout=0.1
    )


def upcast_trainable_to_fp32(model: torch.nn.Module) -> int:
    """Make every trainable parameter an fp32 master weight in place (AdamW on bf16 drops small updates; GradScaler
    refuses fp16 gradients); assigning `.data` keeps the Parameter objects. Returns the number cast."""
    n = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.to(torch.float32)
            n += p.numel()
    return n


@dataclass
class MoTBuild:
    """What `build_mot_model` gives: the adapter (frozen towers + trainable parts) and its token facts."""

    model: MoTAdapterModel | MusicgenRowsMoT
    tokenizer: PreTrainedTokenizerBase
    vocab: AudioVocab  # text ids first, then K x C audio ids, then the audio specials
    bos_id: int
    pad_id: int  # pad positions are masked out and carry no labels; EOS (else BOS) is the natural id


def special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """(bos_id, pad_id) of a caption sequence: the tokenizer's BOS, and its EOS (else BOS) as padding."""
    bos_id = int(tokenizer.bos_token_id)
    return bos_id, int(tokenizer.eos_token_id if tokenizer.eos_token_id is not None else bos_id)


def load_audio_lm_config(audio_lm: str) -> MusicgenDecoderConfig:
    """model.audio_lm's config alone (no weights): shard sets are checked against it before any weight is loaded."""
    try:
        return load_musicgen_decoder_config(audio_lm)
    except OSError as e:
        raise ConfigError(f"model.audio_lm={audio_lm}: {e}") from e


def mot_model(
    llm: LlamaForCausalLM, audio_lm: MusicgenForCausalLM, vocab: AudioVocab, pattern: str, cfg: MoTConfig
) -> MoTAdapterModel | MusicgenRowsMoT:
    """The adapter of `cfg.audio_tower`: `llm` (audio rows ride the Llama's layers with MusicGen's FFNs) or `musicgen`
    (audio rows run MusicGen's own layers and read the caption through their cross-attention)."""
    if cfg.audio_tower == "musicgen":
        return MusicgenRowsMoT(llm, audio_lm, vocab, pattern)
    return MoTAdapterModel(llm, audio_lm, vocab, pattern, cfg)


def build_mot_model(
    cfg: ModelConfig, pattern: str, device: torch.device | str, *, fp32_trainable: bool = True
) -> MoTBuild:
    """Load the tokenizer and both frozen towers, build the MoT adapter for token `pattern` on `device`
    (fp32_trainable: `upcast_trainable_to_fp32`, as training needs). A model that cannot load is a ConfigError."""
    try:
        tokenizer = load_text_tokenizer(cfg.llm)
        llm = load_llm(cfg.llm, cfg.dtype)
        audio_lm = load_musicgen_decoder(cfg.audio_lm, cfg.dtype)
    except OSError as e:
        raise ConfigError(f"model.llm={cfg.llm} / model.audio_lm={cfg.audio_lm}: {e}") from e
    K, C = audio_lm.config.num_codebooks, audio_lm.config.vocab_size
    vocab = AudioVocab(text_vocab_size=llm.config.vocab_size, n_codebooks=K, codebook_size=C)
    bos_id, pad_id = special_ids(tokenizer)
    try:
        model = mot_model(llm, audio_lm, vocab, pattern, cfg.mot)
    except ValueError as e:  # a setting the models cannot take (sizes): one line naming it
        raise ConfigError(str(e)) from e
    if fp32_trainable:
        upcast_trainable_to_fp32(model)
    return MoTBuild(model=model.to(device), tokenizer=tokenizer, vocab=vocab, bos_id=bos_id, pad_id=pad_id)

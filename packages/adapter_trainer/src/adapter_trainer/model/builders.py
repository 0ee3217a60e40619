"""Model builders (torchtune style): literal-size config builders, the tower loaders, and `build_mot_model`,
the one place the MoT adapter is assembled (training and generation both call it).

`load_llm` gives a `LlamaForCausalLM`; `load_musicgen_decoder` gives only MusicGen's decoder
(`MusicgenForCausalLM`) out of a `facebook/musicgen-small`-style composite checkpoint. Neither ever
constructs MusicGen's T5 text encoder or its EnCodec audio codec: this process only sees integer codes.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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

from adapter_trainer.config import ConfigError, TrainConfig, mot_fields
from adapter_trainer.data.token_layout import AudioVocab
from adapter_trainer.model.hub_source import ModelSourceError, cache_only
from adapter_trainer.model.mot import MoTAdapterModel, MoTConfig
from adapter_trainer.model.musicgen_rows import MusicgenRowsMoT

OFFLINE_HINT = (
    "Pass a local directory that holds the checkpoint (e.g. model.llm=/path/to/Llama-3.2-1B "
    "model.audio_lm=/path/to/musicgen-small), get the Hub's files with `hf download <id>` (docs/real-data.md), or "
    "use the offline demo models (`make demo-models`, then +experiment=demo)."
)

# facebook/musicgen-small stores the decoder as `decoder.model.decoder.*` / `decoder.lm_heads.*` next to
# `text_encoder.*`, `audio_encoder.*` and `enc_to_dec_proj.*`; MusicgenForCausalLM expects the part after `decoder.`.
MUSICGEN_DECODER_KEY_MAPPING = {r"^decoder\.": ""}
MUSICGEN_COMPOSITE_PARTS = ("decoder", "text_encoder", "audio_encoder", "enc_to_dec_proj")


@contextmanager
def composite_part(cls: type, part: str) -> Iterator[None]:
    """While `cls.from_pretrained` loads one part of a composite MusicGen checkpoint, the other parts' tensors are
    expected: transformers would list each as UNEXPECTED in a load report (hundreds of lines for musicgen-small's
    EnCodec). Adds their prefixes to `cls._keys_to_ignore_on_load_unexpected` for the call, restored afterwards."""
    others = "|".join(p for p in MUSICGEN_COMPOSITE_PARTS if p != part)
    saved = cls.__dict__.get("_keys_to_ignore_on_load_unexpected", None)
    inherited = getattr(cls, "_keys_to_ignore_on_load_unexpected", None)
    cls._keys_to_ignore_on_load_unexpected = {*(inherited or ()), rf"^({others})\."}
    try:
        yield
    finally:
        if saved is None and "_keys_to_ignore_on_load_unexpected" in cls.__dict__:
            del cls._keys_to_ignore_on_load_unexpected
        else:
            cls._keys_to_ignore_on_load_unexpected = saved


# ---------------------------------------------------------------------------------------------------------------
# Config builders with literal sizes
# ---------------------------------------------------------------------------------------------------------------


def llama3_2_1b_config() -> LlamaConfig:
    """Llama 3.2 1B (meta-llama/Llama-3.2-1B) sizes: hidden 2048, 16 layers, 32 heads / 8 KV heads, vocab 128,256.

    For shape documentation and tests only: the weights come from `load_llm`.
    """
    return LlamaConfig(
        vocab_size=128_256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
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


def tiny_llama_config() -> LlamaConfig:
    """A tiny Llama 3.2-shaped model with the REAL Llama 3 vocabulary (128,256 ids), for the demo and tests."""
    return LlamaConfig(
        vocab_size=128_256,  # the real tokenizer's ids, so captions tokenize exactly as for Llama 3.2
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=131_072,
        rms_norm_eps=1e-5,
        rope_parameters=_llama3_rope(),
        tie_word_embeddings=True,  # like 3.2-1B
        bos_token_id=128_000,
        eos_token_id=128_001,
        attention_bias=False,
        mlp_bias=False,
    )


class MusicgenSpecialIdsFilter(logging.Filter):
    """Drops exactly transformers' two warnings that MusicGen's pad and bos ids (2048) lie outside its vocabulary.

    They do not: each codebook holds codes 0..2047 (`vocab_size` 2048) and MusicGen's embedding tables have one row
    more, so 2048 is the pad / decoder-start row (the real facebook/musicgen-small config has the same ids).
    transformers checks special ids against `vocab_size` alone and says so on every MusicGen config. Every other
    warning, a wrong id in another config included, still shows.
    """

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


# ---------------------------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------------------------


def _resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {sorted(table)}")
    return table[dtype]


def _looks_like_path(name_or_path: str | os.PathLike) -> bool:
    """A directory meant, not a Hub id: an absolute, relative or home path, more than one `/`, or `a/b` where `a` is a
    directory here (`build/x` before it is built is a missing directory, not a Hub repository named `build/x`)."""
    s = str(name_or_path)
    first = s.split("/", 1)[0]
    return (
        isinstance(name_or_path, Path)
        or s.startswith(("/", "./", "../", "~"))
        or s.count("/") > 1
        or os.sep * 2 in s
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
    """`from_pretrained` / `get_config_dict` keywords for where a model is read from: none for a local directory; for
    a Hub id, `local_files_only` as `hub_source.cache_only` decides (offline mode, or the Hub unreachable with the
    model cached). Raises hub_source.ModelSourceError (an OSError) naming the cause and fix."""
    if Path(name_or_path).expanduser().is_dir() or _looks_like_path(name_or_path):
        return {}
    return {"local_files_only": cache_only(str(name_or_path))}


def check_model_sources(cfg: TrainConfig) -> None:
    """Ask once about each tower named by a Hub id (hub_source.cache_only) before anything is loaded; a model neither
    the Hub nor the cache can give is a ConfigError naming its key."""
    for key, name in (("model.llm", cfg.model.llm), ("model.audio_lm", cfg.model.audio_lm)):
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
    """`LlamaForCausalLM` from a hub id (`meta-llama/Llama-3.2-1B`) or a local directory, with sdpa attention.

    Raises:
        OSError: the weights are not available locally (no downloads here); the message says what to pass.
        ValueError: the checkpoint is not a Llama.
    """
    _check_source("LLM", name_or_path)
    try:
        config_dict, _ = PreTrainedConfig.get_config_dict(str(name_or_path), **source_kwargs(name_or_path))
    except OSError as e:
        raise _not_available("LLM", name_or_path, e) from e
    if config_dict.get("model_type") != "llama":
        raise ValueError(
            f"model.llm={str(name_or_path)!r} is a {config_dict.get('model_type')!r} checkpoint; this trainer "
            f"needs a Llama (model_type 'llama', e.g. meta-llama/Llama-3.2-1B)"
        )
    try:
        return LlamaForCausalLM.from_pretrained(
            str(name_or_path), dtype=_resolve_dtype(dtype), attn_implementation="sdpa", **source_kwargs(name_or_path)
        )
    except OSError as e:
        raise _not_available("LLM", name_or_path, e) from e


def load_musicgen_decoder_config(name_or_path: str | os.PathLike) -> MusicgenDecoderConfig:
    """The decoder config out of a composite `musicgen` config.json or a decoder-only `musicgen_decoder` one.

    Reads config dicts only: the composite's T5/EnCodec sub-configs stay plain configs, no model is built.
    """
    _check_source("MusicGen", name_or_path)
    try:
        config_dict, _ = PreTrainedConfig.get_config_dict(str(name_or_path), **source_kwargs(name_or_path))
    except OSError as e:
        raise _not_available("MusicGen config", name_or_path, e) from e
    model_type = config_dict.get("model_type")
    if model_type == MusicgenConfig.model_type:
        # MusicgenDecoderConfig.base_config_key is "decoder_config" but the composite stores "decoder": read it here.
        if "decoder" not in config_dict:
            raise ValueError(f"composite musicgen config at {str(name_or_path)!r} has no 'decoder' entry")
        dec = dict(config_dict["decoder"])
        dec.pop("model_type", None)
        return MusicgenDecoderConfig(**dec)
    if model_type == MusicgenDecoderConfig.model_type:
        return MusicgenDecoderConfig.from_dict(config_dict)
    raise ValueError(
        f"model.audio_lm={str(name_or_path)!r} has model_type {model_type!r}; expected 'musicgen' "
        f"(facebook/musicgen-small layout) or 'musicgen_decoder' (decoder-only checkpoint)"
    )


def load_musicgen_decoder(
    name_or_path: str | os.PathLike, dtype: torch.dtype | str = torch.float32
) -> MusicgenForCausalLM:
    """Only MusicGen's decoder (`MusicgenForCausalLM`), from a composite or a decoder-only checkpoint.

    Composite (`facebook/musicgen-small`): loads the `decoder.`-prefixed tensors through the regular
    `from_pretrained` path with `key_mapping` (sharded safetensors work the same way); `text_encoder.*`,
    `audio_encoder.*` and `enc_to_dec_proj.*` are skipped, never materialised as modules.

    Raises:
        OSError: weights not available locally; the message says what to pass.
        ValueError: a decoder tensor is missing from the checkpoint (named in the message).
    """
    decoder_config = load_musicgen_decoder_config(name_or_path)
    try:
        # The mapping only matches keys that start with `decoder.`: a decoder-only checkpoint
        # (`model.decoder.*`, `lm_heads.*`) passes through unchanged.
        with composite_part(MusicgenForCausalLM, "decoder"):
            model, info = MusicgenForCausalLM.from_pretrained(
                str(name_or_path),
                config=decoder_config,
                dtype=_resolve_dtype(dtype),
                output_loading_info=True,
                key_mapping=MUSICGEN_DECODER_KEY_MAPPING,
                **source_kwargs(name_or_path),
            )
    except OSError as e:
        raise _not_available("MusicGen decoder", name_or_path, e) from e
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
    """facebook/musicgen-small's decoder sizes: 4 codebooks x 2048 codes, hidden 1024, 24 layers, 16 heads, ffn 4096.

    For shape documentation and the real-size benchmark (random weights): the weights come from `load_musicgen_decoder`.
    """
    return _musicgen_decoder_config(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, ffn_dim=4096, dropout=0.1
    )


def upcast_trainable_to_fp32(model: torch.nn.Module) -> int:
    """Make every trainable parameter an fp32 master weight in place; frozen ones keep `model.dtype`.

    The MoT builds its new modules (adapters, audio embeddings/heads/norms, LoRA) in the towers' dtype; AdamW on
    bf16 weights rounds every update below bf16's resolution (~0.4% of the weight) away, and GradScaler refuses to
    unscale fp16 gradients. Autocast then runs each matmul in the low dtype. Assigning `.data` keeps the Parameter
    objects (and any optimizer references) alive, as peft's `cast_mixed_precision_params` does. Returns the number
    of parameters that were cast.
    """
    n = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.to(torch.float32)
            n += p.numel()
    return n


# ---------------------------------------------------------------------------------------------------------------
# The MoT adapter, built once for training and generation alike
# ---------------------------------------------------------------------------------------------------------------


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


def load_audio_lm_config(cfg: TrainConfig) -> MusicgenDecoderConfig:
    """The audio LM's config alone (no weights): shard sets are checked against it before any weight is loaded."""
    try:
        return load_musicgen_decoder_config(cfg.model.audio_lm)
    except OSError as e:
        raise ConfigError(f"model.audio_lm={cfg.model.audio_lm}: {e}") from e


def mot_model(
    llm: LlamaForCausalLM, audio_lm: MusicgenForCausalLM, vocab: AudioVocab, pattern: str, cfg: MoTConfig
) -> MoTAdapterModel | MusicgenRowsMoT:
    """The adapter of `cfg.audio_tower`: `llm` (audio rows ride the Llama's layers with MusicGen's FFNs) or `musicgen`
    (audio rows run MusicGen's own layers and read the caption through their cross-attention)."""
    if cfg.audio_tower == "musicgen":
        return MusicgenRowsMoT(
            llm,
            audio_lm,
            vocab,
            pattern,
            cfg.layer_map,
            caption_init=cfg.caption_init,
            caption_projection=cfg.caption_projection,
            caption_layer=cfg.caption_layer,
            cross_attention=cfg.cross_attention,
        )
    return MoTAdapterModel(llm, audio_lm, vocab, pattern, cfg)


def build_mot_model(cfg: TrainConfig, device: torch.device | str, *, fp32_trainable: bool = True) -> MoTBuild:
    """Load the tokenizer and both frozen towers of `cfg.model`, build the MoT adapter and move it to `device`.

    fp32_trainable: make every trainable tensor an fp32 master weight (`upcast_trainable_to_fp32`), as training
    needs; the frozen towers keep model.dtype. Raises ConfigError (naming model.llm / model.audio_lm and the fix)
    when a model cannot be loaded.
    """
    try:
        tokenizer = load_text_tokenizer(cfg.model.llm)
        llm = load_llm(cfg.model.llm, cfg.model.dtype)
        audio_lm = load_musicgen_decoder(cfg.model.audio_lm, cfg.model.dtype)
    except OSError as e:
        raise ConfigError(f"model.llm={cfg.model.llm} / model.audio_lm={cfg.model.audio_lm}: {e}") from e
    K, C = audio_lm.config.num_codebooks, audio_lm.config.vocab_size
    vocab = AudioVocab(text_vocab_size=llm.config.vocab_size, n_codebooks=K, codebook_size=C)
    bos_id, pad_id = special_ids(tokenizer)
    try:
        model = mot_model(llm, audio_lm, vocab, cfg.data.pattern, MoTConfig(**mot_fields(cfg)))
    except ValueError as e:  # a setting the models cannot take (sizes, layer_map): one line naming it
        raise ConfigError(str(e)) from e
    if fp32_trainable:
        upcast_trainable_to_fp32(model)
    return MoTBuild(model=model.to(device), tokenizer=tokenizer, vocab=vocab, bos_id=bos_id, pad_id=pad_id)

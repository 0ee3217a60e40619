"""Structured configs: these dataclasses ARE the schema; the YAML under conf/adapter_trainer only overrides them.

Hydra composes `config.yaml` on top of the `adapter_trainer_schema` node stored below, so an unknown key or a wrongly
typed value fails at composition time. `to_train_config()` turns the composed DictConfig into a validated
`TrainConfig`; from there on only typed values travel. Required values are `???` (MISSING). Value sets OmegaConf
cannot type are checked in `validate_config`, the one place stage 2 checks a user's settings.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from adapter_trainer.errors import UserError

PATTERNS = ("flatten", "delay")
TEXT_FIELDS = ("caption", "aspects")
CACHE_POLICIES = ("order", "lru")  # adapter_trainer.data.remote.cache.POLICIES (config imports no room)
PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES = ("float32", "bfloat16", "float16")
EMBED_INITS = ("musicgen", "random")
AUDIO_ATTENTION = ("shared", "lora", "separate")
AUDIO_TOWERS = ("llm", "musicgen")


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message names the key and the override that fixes it."""


@dataclass
class CacheConfig:
    """The local cache of remote shard sets (data/remote/cache.py)."""

    dir: str = ""  # "" = $ADAPTER_TRAINER_SHARD_CACHE, else $XDG_CACHE_HOME/adapter_trainer/shards (~/.cache/...)
    max_bytes: int = 0  # hard bound on the cache's bytes on disk (shared by a node's ranks); 0 = no bound
    prefetch: int = 8  # micro-batches ahead whose shards each rank fetches in the background; 0 = on demand only
    policy: str = "order"  # order: evict the shard whose next use is farthest (Belady) | lru: least recently used
    retries: int = 5  # tries per remote read (timeouts, 5xx, 429), capped exponential backoff with jitter


@dataclass
class DataConfig:
    # shard-set dirs or URLs (each holds manifest.json), concatenated; {path: DIR, weight: W} entries make a weighted
    # mixture (a plain path weighs 1). List[Any]: OmegaConf cannot type "str or dict".
    shards: List[Any] = MISSING
    train_split: str = "train"  # split name inside each shard set
    eval_split: str = "eval"
    max_seq_len: int = 1024  # tokens per sequence (caption + audio); longer clips are cropped
    max_caption_tokens: int = 64  # caption tokens kept (without BOS); longer captions are truncated
    pattern: str = "delay"  # flatten | delay: how the K codebooks are laid out in time
    text: str = "caption"  # caption | aspects: the CSV caption, or its aspect_list joined with ", "
    eval_max_clips: int = 256  # eval clips scored (first N of the eval split); 0 = all
    verify_sha256: bool = False  # hash every shard against the manifest at startup (slow on big sets)
    unigram_max_clips: int = 4096  # train clips (evenly spaced) read at startup for the unigram baseline; 0 = all
    allow_eval_overlap: bool = False  # accept eval clips whose keys are train clips (the report says NOT held-out)
    caption_dropout: float = 0.1  # P(train caption -> empty caption): the unconditioned branch generation's CFG needs
    mixture_epoch_size: int = 0  # examples per epoch of a weighted mixture; 0 = the sum of the sets' train clips
    start_crop_prob: float = 0.0  # P(a training crop starts at the clip's first frame instead of a random frame)
    cache: CacheConfig = field(default_factory=CacheConfig)  # for shard sets at URLs (s3://, hf://, ...)


@dataclass
class MoTConfig:
    """The MoT adapter (model/mot.py; audio_tower=musicgen: model/musicgen_rows.py)."""

    # shared | lora | separate: audio rows use the Llama's attention projections (frozen), add LoRA on q/v, or get
    # their own trainable norm + q/k/v/o (copies of the Llama's); text rows always keep the frozen Llama's
    audio_attention: str = "shared"
    lora_rank: int = 0  # LoRA rank on audio rows' q/v; > 0 exactly when audio_attention=lora
    lora_alpha: float = 16.0
    audio_embed_init: str = "musicgen"  # musicgen (MusicGen's code embeddings) | random
    audio_head_init: str = "musicgen"  # musicgen (MusicGen's lm_heads) | random
    # musicgen: audio rows run MusicGen's own decoder layers and read the caption through its cross-attention (every
    # preset's); llm: audio rows ride the frozen Llama's layers with MusicGen's FFN blocks as experts
    audio_tower: str = "musicgen"


@dataclass
class ModelConfig:
    llm: str = MISSING  # hub id or local dir of the text LLM (frozen)
    audio_lm: str = MISSING  # hub id or local dir of the MusicGen model whose decoder is used (frozen)
    # float32 | bfloat16 | float16: dtype of the FROZEN towers only (trainable weights stay fp32);
    # bfloat16 needs trainer.precision=bf16, float16 needs trainer.precision=fp16 (CUDA)
    dtype: str = "float32"
    mot: MoTConfig = field(default_factory=MoTConfig)


@dataclass
class OptimizerConfig:
    lr: float = 3e-4  # peak LR after warmup
    weight_decay: float = 0.01  # applied to >=2-D weights only (no decay on biases / norms)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_steps: int = 100  # linear warmup from 0 to lr
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at trainer.max_steps
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # lr multiplier for trainable COPIES of pretrained weights (separate attention's q/k/v/o + norm; musicgen-init
    # tables and heads; the musicgen tower's cross-attention)
    pretrained_copy_lr_scale: float = 1.0


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 uses a GradScaler on cuda only)
    batch_size: int = 8  # sequences per micro-batch
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    max_steps: int = 1000  # optimizer steps
    eval_every: int = 200  # optimizer steps between evals; 0 = only the final eval
    ckpt_every: int = 500  # optimizer steps between checkpoints; 0 = only the final checkpoint
    log_every: int = 10  # optimizer steps between metric records
    seed: int = 1234
    output_dir: str = MISSING  # run directory (checkpoints, metrics, plots); Hydra's run dir too
    resume: Optional[str] = None  # checkpoint dir, or "latest" (newest under output_dir/checkpoints)
    overwrite: bool = False  # true: a fresh run deletes output_dir/checkpoints left by another run; false: refuses
    eval_bootstrap: int = 1000  # bootstrap resamples for the caption-gain interval
    eval_caption_shuffles: int = 4  # caption derangements averaged for the shuffled-caption CE
    # the learning check also scores the frozen music LM alone (no caption) on the eval targets (delay pattern only)
    eval_music_lm: bool = True
    # with eval_music_lm: also score the teacher, MusicGen as it ships reading each caption through its own T5
    eval_teacher: bool = True
    num_workers: int = -1  # DataLoader workers per rank; -1 = auto (half the rank's CPUs, 1..8), 0 = in-process
    prefetch_factor: int = 4  # micro-batches each worker builds ahead of the step
    tensorboard: bool = True  # also write TensorBoard event files next to metrics.jsonl
    progress_bar: bool = True  # tqdm bar with loss and tokens/s
    activation_checkpointing: bool = False  # recompute each layer in backward: less activation memory, one more forward


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


SCHEMA_NAME = "adapter_trainer_schema"
ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)  # config.yaml lists it first in its defaults


@dataclass(frozen=True)
class ShardSource:
    """One entry of data.shards: a shard-set directory and its mixture weight (None: a plain path)."""

    path: str  # as written in the config (also the name of the set in the per-set learning check)
    weight: Optional[float] = None  # > 0; None = not given (weight 1 in a mixture)


SHARD_ENTRY_KEYS = ("path", "weight")
_SHARD_FIX = "write a plain path or {path: DIR, weight: W} with W > 0, e.g. 'data.shards=[{path: a, weight: 3}, b]'"


def _shard_entry(i: int, entry: Any) -> ShardSource:
    """data.shards[i] -> ShardSource. Raises ConfigError naming the entry and the fix."""
    where = f"data.shards[{i}]={entry!r}"
    if isinstance(entry, (str, Path, int, float)) and not isinstance(entry, bool):  # a bare name like 2024 stays a path
        return ShardSource(str(entry))
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} is neither a path nor a mapping; {_SHARD_FIX}")
    unknown = sorted(set(map(str, entry)) - set(SHARD_ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {unknown} (allowed: path, weight); {_SHARD_FIX}")
    path = entry.get("path")
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"{where} has no path; {_SHARD_FIX}")
    weight = entry.get("weight")
    if weight is None:
        return ShardSource(str(path))
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
        raise ConfigError(f"{where}: weight must be a finite number > 0, got {weight!r}; {_SHARD_FIX}")
    return ShardSource(str(path), float(weight))


def shard_sources(shards: List[Any]) -> list[ShardSource]:
    """data.shards -> one ShardSource per entry; refuses bad entries and the same directory listed twice."""
    sources = [_shard_entry(i, e) for i, e in enumerate(shards)]
    seen: dict[Path, int] = {}
    for i, s in enumerate(sources):
        resolved = Path(s.path).expanduser().resolve()  # a URL too: "s3://b/x/" and "s3://b/x" are one set
        if resolved in seen:
            raise ConfigError(
                f"data.shards[{i}]={s.path!r} is the same shard set as data.shards[{seen[resolved]}]; list each set "
                f"once (give it a larger weight to draw it more often)"
            )
        seen[resolved] = i
    return sources


def shard_paths(shards: List[Any]) -> list[str]:
    """The shard-set directories of data.shards, in order (weights dropped)."""
    return [s.path for s in shard_sources(shards)]


def shard_weights(shards: List[Any]) -> list[float] | None:
    """Mixture weights per set when any entry of data.shards gives one (plain paths weigh 1); None: concatenation."""
    sources = shard_sources(shards)
    if all(s.weight is None for s in sources):
        return None
    return [1.0 if s.weight is None else s.weight for s in sources]


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{key}={value!r} is not supported; choose one of {', '.join(allowed)} (e.g. {key}={allowed[0]})"
        )


def _check_range(key: str, value: float, low: float, high: float, *, high_ok: bool = True) -> None:
    if not (low <= value <= high if high_ok else low <= value < high):
        raise ConfigError(f"{key}={value} must be in [{low}, {high}{']' if high_ok else ')'}; override it")


POSITIVE = ("data.max_seq_len", "data.max_caption_tokens", "data.cache.retries", "trainer.batch_size")
POSITIVE += ("trainer.grad_accum_steps", "trainer.max_steps", "trainer.log_every", "trainer.eval_bootstrap")
POSITIVE += ("trainer.eval_caption_shuffles", "trainer.prefetch_factor")
NON_NEGATIVE = ("trainer.eval_every", "trainer.ckpt_every", "data.eval_max_clips", "data.unigram_max_clips")
NON_NEGATIVE += ("data.cache.max_bytes", "data.cache.prefetch", "optimizer.warmup_steps", "optimizer.weight_decay")
NON_NEGATIVE += ("optimizer.grad_clip", "optimizer.pretrained_copy_lr_scale")


def validate_config(cfg: TrainConfig) -> None:
    """Check value sets and ranges OmegaConf cannot express. Raises ConfigError naming the key and the fix."""
    data, mot = cfg.data, cfg.model.mot
    for key, value, allowed in (
        ("data.pattern", data.pattern, PATTERNS),
        ("data.text", data.text, TEXT_FIELDS),
        ("data.cache.policy", data.cache.policy, CACHE_POLICIES),
        ("trainer.precision", cfg.trainer.precision, PRECISIONS),
        ("model.dtype", cfg.model.dtype, DTYPES),
        ("model.mot.audio_embed_init", mot.audio_embed_init, EMBED_INITS),
        ("model.mot.audio_head_init", mot.audio_head_init, EMBED_INITS),
        ("model.mot.audio_attention", mot.audio_attention, AUDIO_ATTENTION),
        ("model.mot.audio_tower", mot.audio_tower, AUDIO_TOWERS),
    ):
        _check_choice(key, value, allowed)
    for keys, zero_ok in ((POSITIVE, False), (NON_NEGATIVE, True)):
        for key in keys:
            value = functools.reduce(getattr, key.split("."), cfg)
            if value < 0 or (value == 0 and not zero_ok):
                raise ConfigError(f"{key}={value} must be {'>= 0' if zero_ok else '> 0'}; override it, e.g. {key}=1")
    if mot.audio_tower == "musicgen":
        _check_musicgen_tower(cfg)
    if (mot.lora_rank > 0) != (mot.audio_attention == "lora"):
        raise ConfigError(
            f"model.mot.lora_rank={mot.lora_rank} with model.mot.audio_attention={mot.audio_attention}: LoRA is the "
            f"'lora' variant; pass model.mot.audio_attention=lora model.mot.lora_rank=16, or model.mot.lora_rank=0"
        )
    if not data.shards:
        raise ConfigError(
            "data.shards is empty; give at least one shard-set dir, e.g. 'data.shards=[build/demo/shards]'"
        )
    weights = shard_weights(data.shards)  # checks every entry of data.shards
    if data.mixture_epoch_size < 0 or (data.mixture_epoch_size and weights is None):
        raise ConfigError(
            f"data.mixture_epoch_size={data.mixture_epoch_size} needs weighted data.shards (entries "
            f"{{path: DIR, weight: W}}) and must be >= 0 (0 = the sum of the sets' train clips); drop it or add weights"
        )
    if cfg.trainer.num_workers < -1:
        raise ConfigError(
            f"trainer.num_workers={cfg.trainer.num_workers} must be -1 (auto), 0 (build batches in the "
            f"training process) or a number of worker processes, e.g. trainer.num_workers=2"
        )
    # Frozen towers in bf16/fp16 meet fp32 trainable weights in every layer: only autocast mixes the two dtypes.
    needed = {"bfloat16": "bf16", "float16": "fp16"}.get(cfg.model.dtype)
    if needed is not None and cfg.trainer.precision != needed:
        alt = "bf16" if needed == "bf16" else "fp16 (CUDA only), or model.dtype=bfloat16 trainer.precision=bf16"
        raise ConfigError(
            f"model.dtype={cfg.model.dtype} with trainer.precision={cfg.trainer.precision}: the frozen towers are "
            f"{cfg.model.dtype} and the trainable weights fp32, which only {needed} autocast can mix. Use "
            f"trainer.precision={alt}, or model.dtype=float32"
        )
    _check_range("data.caption_dropout", data.caption_dropout, 0.0, 1.0, high_ok=False)
    _check_range("data.start_crop_prob", data.start_crop_prob, 0.0, 1.0)
    _check_range("optimizer.min_lr_ratio", cfg.optimizer.min_lr_ratio, 0.0, 1.0)
    if len(cfg.optimizer.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optimizer.betas):
        raise ConfigError(f"optimizer.betas={list(cfg.optimizer.betas)} must be two values in [0, 1), e.g. [0.9,0.95]")
    if data.max_caption_tokens + 4 >= data.max_seq_len:
        raise ConfigError(
            f"data.max_caption_tokens={data.max_caption_tokens} leaves no room for audio in "
            f"data.max_seq_len={data.max_seq_len}; raise data.max_seq_len or lower data.max_caption_tokens"
        )


LLM_TOWER_KEYS = ("audio_attention", "lora_rank", "audio_embed_init", "audio_head_init")


def _check_musicgen_tower(cfg: TrainConfig) -> None:
    """audio_tower=musicgen runs MusicGen's own attention, tables and heads on its delay pattern: the llm tower's
    keys stay at their defaults."""
    mot, default = cfg.model.mot, MoTConfig()
    bad = [k for k in LLM_TOWER_KEYS if getattr(mot, k) != getattr(default, k)]
    have = [f"model.mot.{k}={getattr(mot, k)}" for k in bad]
    want = [f"model.mot.{k}={getattr(default, k)}" for k in bad]
    if cfg.data.pattern != "delay":
        have, want = [*have, f"data.pattern={cfg.data.pattern}"], [*want, "data.pattern=delay"]
    if have:
        raise ConfigError(
            f"model.mot.audio_tower=musicgen runs MusicGen's own layers, tables and heads, so {', '.join(have)} "
            f"cannot apply: set them back ({' '.join(want)}) or use model.mot.audio_tower=llm"
        )


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Composed DictConfig -> validated TrainConfig instance. Raises ConfigError for missing/bad values."""
    try:
        typed = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", None) or "?"
        hint = {"data.shards": "'data.shards=[path/to/shard-set]'"}.get(key, f"{key}=VALUE")
        raise ConfigError(
            f"required config value {key} is not set (???). Pass {hint}, or start from an experiment: "
            f"+experiment=demo | mps_small | cuda_1b"
        ) from e
    if not isinstance(typed, TrainConfig):
        raise ConfigError(
            f"composed config is {type(typed).__name__}, not TrainConfig: config.yaml must list "
            f"'{SCHEMA_NAME}' first in its defaults"
        )
    validate_config(typed)
    return typed


def config_to_yaml(cfg: TrainConfig) -> str:
    """Resolved YAML of a typed config (stored in checkpoints and the run dir)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)


def shards_as_list(argv: list[str]) -> list[str]:
    """The command line with `data.shards=DIR` or `data.shards=a,b` written as a list (`['DIR']`, `['a','b']`); under
    --multirun a comma list sweeps over single sets (`['a'],['b']`). Lists, mappings and quoted values stay one entry."""
    multirun = any(a in ("-m", "--multirun") or a.replace(" ", "") == "hydra.mode=MULTIRUN" for a in argv)
    out = []
    for arg in argv:
        head, sep, value = arg.partition("=")
        if not sep or head.lstrip("+") != "data.shards" or value.startswith("["):
            out.append(arg)
        elif value.startswith(("'", '"', "{")):
            out.append(f"{head}=[{value}]")
        else:
            items = [f"'{v}'" for v in (v.replace("\\", "\\\\").replace("'", "\\'") for v in value.split(",")) if v]
            out.append(f"{head}=" + (",".join(f"[{v}]" for v in items) if multirun else f"[{','.join(items)}]"))
    return out

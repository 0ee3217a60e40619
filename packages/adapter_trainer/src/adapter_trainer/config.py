"""Structured configs: these dataclasses ARE the schema; the YAML under conf/adapter_trainer only overrides them.

Hydra composes `config.yaml` on top of the `adapter_trainer_schema` node stored below, so an unknown key or
a wrongly typed value fails at composition time. `main()` converts the composed DictConfig to a `TrainConfig`
instance with `to_train_config()`; from there on only typed values travel (no DictConfig in the recipe).

Required values are `???` (MISSING). Value sets that OmegaConf cannot type (Literal) are checked in
`validate_config`, which names the key, the allowed values and the override that fixes it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from adapter_trainer.errors import UserError

PATTERNS = ("flatten", "delay")
TEXT_FIELDS = ("caption", "aspects")
CACHE_POLICIES = (
    "order",
    "lru",
)  # data.cache.policy: adapter_trainer.data.remote.cache.POLICIES (config imports no room)
PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES = ("float32", "bfloat16", "float16")
EMBED_INITS = ("musicgen", "random")
AUDIO_ATTENTION = ("shared", "lora", "separate")  # model.mot.audio_attention (adapter_trainer.model.mot)
AUDIO_TOWERS = ("llm", "musicgen")  # model.mot.audio_tower: whose layers the audio rows run (model.builders.mot_model)
# audio_tower=musicgen's caption path (adapter_trainer.model.musicgen_rows): its init, its projections, MusicGen's
# cross-attention trained or frozen
CAPTION_INITS = ("zero_proj", "zero_gate")
CAPTION_PROJECTIONS = ("per_layer", "shared")
CROSS_ATTENTION = ("train", "freeze")


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message names the key and the override that fixes it."""


@dataclass
class CacheConfig:
    """The local cache of remote shard sets (adapter_trainer/data/remote/cache.py; docs/real-data.md)."""

    dir: str = ""  # "" = $ADAPTER_TRAINER_SHARD_CACHE, else $XDG_CACHE_HOME/adapter_trainer/shards (~/.cache/...)
    max_bytes: int = 0  # hard bound on the cache's bytes on disk (shared by a node's ranks); 0 = no bound
    prefetch: int = 8  # micro-batches ahead whose shards each rank fetches in the background; 0 = on demand only
    policy: str = "order"  # order: evict the shard whose next use is farthest (Belady) | lru: least recently used
    retries: int = 5  # tries per remote read (timeouts, 5xx, 429), capped exponential backoff with jitter


@dataclass
class DataConfig:
    # shard-set directories (each holds manifest.json): plain paths are concatenated; entries {path: DIR, weight: W}
    # make a weighted mixture (a plain path then weighs 1). List[Any]: OmegaConf cannot type "str or dict".
    shards: List[Any] = MISSING
    train_split: str = "train"  # split name inside each shard set (docs/shard-format.md)
    eval_split: str = "eval"
    max_seq_len: int = 1024  # tokens per sequence (caption + audio); longer clips are cropped
    max_caption_tokens: int = 64  # caption tokens kept (without BOS); longer captions are truncated
    pattern: str = "delay"  # flatten | delay: how the K codebooks are laid out in time
    text: str = (
        "caption"  # caption | aspects: the CSV caption, or its aspect_list joined with ", " (shorter, keyword-dense)
    )
    eval_max_clips: int = 256  # eval clips scored (first N of the eval split); 0 = all
    verify_sha256: bool = False  # hash every shard against the manifest at startup (slow on big sets)
    # --- streaming (adapter_trainer/data/streaming.py)
    unigram_max_clips: int = 4096  # train clips (evenly spaced) read at startup for the unigram baseline; 0 = all
    # true: accept eval clips whose keys are also train clips (the report then says the check is NOT held-out)
    allow_eval_overlap: bool = False
    caption_dropout: float = 0.0  # P(train caption -> empty caption): teaches the unconditioned branch CFG needs
    # examples per epoch of a weighted mixture (adapter_trainer/data/mixture.py); 0 = the sum of the sets' train clips
    mixture_epoch_size: int = 0
    # P(a training crop starts at the clip's first frame instead of a random frame): random crops of long clips
    # almost never show a clip's start, where the caption is all the model has (the eval window starts there)
    start_crop_prob: float = 0.0
    # P(each word of a training caption is left out), training only: against memorising clip-identifying words
    caption_word_dropout: float = 0.0
    cache: CacheConfig = field(default_factory=CacheConfig)  # for shard sets at URLs (s3://, hf://, ...)


@dataclass
class MoTSchema:
    """Mirror of `adapter_trainer.model.mot.MoTConfig` (Literal fields typed as str, checked in validate_config)."""

    layer_map: Optional[List[int]] = None  # llm layer l -> musicgen layer m(l); None = evenly spaced
    freeze_audio_ffn: bool = True  # True: only attention-side adapters train; False: audio FFNs train too
    # shared | lora | separate: audio positions use the Llama's attention projections (frozen), add LoRA on q/v,
    # or get their own trainable norm + q/k/v/o (copies of the Llama's); text positions always stay the frozen LLM's
    audio_attention: str = "shared"
    lora_rank: int = 0  # LoRA rank on audio rows' q/v; > 0 exactly when audio_attention=lora
    lora_alpha: float = 16.0
    audio_embed_init: str = "musicgen"  # musicgen | random
    audio_head_init: str = "musicgen"  # musicgen | random
    random_init_scale: float = 0.1  # x text-embedding std, for "random" init
    # > 0: a caption summary (per layer, the mean of the caption rows' normed hidden states) goes through a trainable
    # rank-r map (zero-init up) into every audio row's residual stream: a direct caption path besides attention
    caption_cond_rank: int = 0
    # llm: audio rows ride the frozen Llama's layers, with MusicGen's FFN blocks as experts (the fields above);
    # musicgen: audio rows run MusicGen's own decoder layers (its attention, norms, positions, FFNs, heads), reading
    # the caption through a zero-gated cross-attention per MusicGen layer (layer_map: MusicGen layer -> Llama layer)
    audio_tower: str = "llm"
    # audio_tower=musicgen only (refused with llm unless at their defaults):
    # zero_proj: the caption projection starts at 0 behind an open gate (a plain scalar, 1.0), so the path is exactly 0
    # at init yet learns from step 0; zero_gate: a normal-init projection behind tanh(gate), gate 0 (the first version)
    caption_init: str = "zero_proj"
    # per_layer: a norm + projection per MusicGen layer, of Llama layer layer_map[m]; shared: one norm + projection of
    # Llama layer caption_layer feeds every MusicGen layer's cross-attention (musicgen-small's enc_to_dec_proj)
    caption_projection: str = "per_layer"
    caption_layer: int = -1  # shared only: the Llama layer read (-1 = the last, after the Llama's final norm)
    cross_attention: str = "train"  # train: MusicGen's cross-attention trains (lr x pretrained_copy_lr_scale) | freeze


@dataclass
class ModelConfig:
    llm: str = MISSING  # hub id or local dir of the text LLM (frozen)
    audio_lm: str = MISSING  # hub id or local dir of the MusicGen model whose decoder is used (frozen)
    # float32 | bfloat16 | float16: dtype of the FROZEN towers only (trainable params are always fp32 master
    # weights); bfloat16 needs trainer.precision=bf16, float16 needs trainer.precision=fp16 (CUDA)
    dtype: str = "float32"
    mot: MoTSchema = field(default_factory=MoTSchema)


@dataclass
class OptimizerConfig:
    lr: float = 3e-4  # peak LR after warmup
    weight_decay: float = 0.01  # applied to >=2-D weights only (no decay on biases / norms)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_steps: int = 100  # linear warmup from 0 to lr
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at trainer.max_steps
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # lr multiplier for trainable COPIES of pretrained weights (separate attention's q/k/v/o + norm; musicgen-init
    # embeddings/heads): fine-tuning pretrained weights wants a smaller step than training new adapters
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
    # true: a fresh run (no trainer.resume) deletes output_dir/checkpoints left by an older run; false: it refuses
    overwrite: bool = False
    eval_bootstrap: int = 1000  # bootstrap resamples for the caption-gain interval
    eval_caption_shuffles: int = (
        4  # caption derangements averaged for the shuffled-caption CE (more = tighter interval, slower eval)
    )
    # true: the learning check also scores the frozen music LM alone (MusicGen, no caption) on the same eval targets,
    # once at setup (delay pattern only: flatten has no MusicGen reading); the adapter's gain over it is in every report
    eval_music_lm: bool = True
    # true (with eval_music_lm): also score the teacher, MusicGen as it ships reading each caption through its own
    # text encoder (model.audio_lm's T5 + enc_to_dec_proj; never its codec), with true and deranged captions, once
    # at setup; the report says by how much the adapter is over or under it
    eval_teacher: bool = True
    # --- data loading + distributed (see adapter_trainer/data/streaming.py, training/distributed.py)
    num_workers: int = -1  # DataLoader workers per rank building batches; -1 = auto (half the rank's CPUs, 1..8)
    prefetch_factor: int = 4  # micro-batches each worker builds ahead of the step
    tensorboard: bool = True  # also write TensorBoard event files next to metrics.jsonl
    progress_bar: bool = True  # tqdm bar with loss and tokens/s
    # true: each MoT layer keeps only its input and is recomputed in backward (less activation memory, one more forward)
    activation_checkpointing: bool = False
    # the training loss weighs the code targets of each window's first `early_frames` frames (token_layout.target_frames)
    # `early_frame_loss_weight` times: there the caption is all the model has; 1.0 = plain CE (eval CE is never weighted)
    early_frames: int = 10
    early_frame_loss_weight: float = 1.0


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


SCHEMA_NAME = "adapter_trainer_schema"


def register_configs() -> None:
    """Store the schema in Hydra's ConfigStore (idempotent); config.yaml lists it first in its defaults."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)


register_configs()


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


def shard_paths(cfg: TrainConfig) -> list[str]:
    """The shard-set directories of data.shards, in order (weights dropped)."""
    return [s.path for s in shard_sources(cfg.data.shards)]


def shard_weights(cfg: TrainConfig) -> list[float] | None:
    """Mixture weights per set when any entry of data.shards gives one (plain paths weigh 1); None: concatenation."""
    sources = shard_sources(cfg.data.shards)
    if all(s.weight is None for s in sources):
        return None
    return [1.0 if s.weight is None else s.weight for s in sources]


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{key}={value!r} is not supported; choose one of {', '.join(allowed)} (e.g. {key}={allowed[0]})"
        )


def _check_positive(key: str, value: int | float, *, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{key}={value} must be {'>= 0' if zero_ok else '> 0'}; override it, e.g. {key}=1")


def validate_config(cfg: TrainConfig) -> None:
    """Check value sets and ranges OmegaConf cannot express. Raises ConfigError naming the key and the fix."""
    _check_choice("data.pattern", cfg.data.pattern, PATTERNS)
    _check_choice("data.text", cfg.data.text, TEXT_FIELDS)
    _check_choice("data.cache.policy", cfg.data.cache.policy, CACHE_POLICIES)
    _check_positive("data.cache.max_bytes", cfg.data.cache.max_bytes, zero_ok=True)
    _check_positive("data.cache.prefetch", cfg.data.cache.prefetch, zero_ok=True)
    _check_positive("data.cache.retries", cfg.data.cache.retries)
    _check_choice("trainer.precision", cfg.trainer.precision, PRECISIONS)
    _check_choice("model.dtype", cfg.model.dtype, DTYPES)
    _check_choice("model.mot.audio_embed_init", cfg.model.mot.audio_embed_init, EMBED_INITS)
    _check_choice("model.mot.audio_head_init", cfg.model.mot.audio_head_init, EMBED_INITS)
    _check_choice("model.mot.audio_attention", cfg.model.mot.audio_attention, AUDIO_ATTENTION)
    _check_choice("model.mot.audio_tower", cfg.model.mot.audio_tower, AUDIO_TOWERS)
    _check_choice("model.mot.caption_init", cfg.model.mot.caption_init, CAPTION_INITS)
    _check_choice("model.mot.caption_projection", cfg.model.mot.caption_projection, CAPTION_PROJECTIONS)
    _check_choice("model.mot.cross_attention", cfg.model.mot.cross_attention, CROSS_ATTENTION)
    _check_musicgen_tower(cfg)
    if (cfg.model.mot.lora_rank > 0) != (cfg.model.mot.audio_attention == "lora"):
        raise ConfigError(
            f"model.mot.lora_rank={cfg.model.mot.lora_rank} with model.mot.audio_attention="
            f"{cfg.model.mot.audio_attention}: LoRA is the 'lora' variant; pass model.mot.audio_attention=lora "
            f"model.mot.lora_rank=16, or model.mot.lora_rank=0"
        )
    if not cfg.data.shards:
        raise ConfigError(
            "data.shards is empty; give at least one shard-set dir, e.g. 'data.shards=[build/demo/shards]'"
        )
    weights = shard_weights(cfg)  # checks every entry of data.shards
    if cfg.data.mixture_epoch_size < 0 or (cfg.data.mixture_epoch_size and weights is None):
        raise ConfigError(
            f"data.mixture_epoch_size={cfg.data.mixture_epoch_size} needs weighted data.shards (entries "
            f"{{path: DIR, weight: W}}) and must be >= 0 (0 = the sum of the sets' train clips); drop it or add weights"
        )
    for key in (
        "data.max_seq_len",
        "data.max_caption_tokens",
        "trainer.batch_size",
        "trainer.grad_accum_steps",
        "trainer.max_steps",
        "trainer.log_every",
        "trainer.eval_bootstrap",
        "trainer.eval_caption_shuffles",
    ):
        section, name = key.split(".")
        _check_positive(key, getattr(getattr(cfg, section), name))
    for key in (
        "trainer.eval_every",
        "trainer.ckpt_every",
        "data.eval_max_clips",
        "data.unigram_max_clips",
        "optimizer.warmup_steps",
        "optimizer.weight_decay",
        "optimizer.grad_clip",
        "optimizer.pretrained_copy_lr_scale",
    ):
        section, name = key.split(".")
        _check_positive(key, getattr(getattr(cfg, section), name), zero_ok=True)
    if cfg.trainer.num_workers < -1:
        raise ConfigError(
            f"trainer.num_workers={cfg.trainer.num_workers} must be -1 (auto), 0 (build batches in the "
            f"training process) or a number of worker processes, e.g. trainer.num_workers=2"
        )
    _check_positive("trainer.prefetch_factor", cfg.trainer.prefetch_factor)
    # Frozen towers in bf16/fp16 meet fp32 trainable weights in every layer: only autocast mixes the two dtypes.
    needed = {"bfloat16": "bf16", "float16": "fp16"}.get(cfg.model.dtype)
    if needed is not None and cfg.trainer.precision != needed:
        alt = (
            "trainer.precision=bf16"
            if needed == "bf16"
            else "trainer.precision=fp16 (CUDA only), or model.dtype=bfloat16 trainer.precision=bf16"
        )
        raise ConfigError(
            f"model.dtype={cfg.model.dtype} with trainer.precision={cfg.trainer.precision}: the frozen towers are "
            f"{cfg.model.dtype} and the trainable weights fp32, which only {needed} autocast can mix. Use {alt}, "
            f"or model.dtype=float32"
        )
    if not 0.0 <= cfg.data.caption_dropout < 1.0:
        raise ConfigError(
            f"data.caption_dropout={cfg.data.caption_dropout} must be in [0, 1), e.g. data.caption_dropout=0.1"
        )
    if cfg.trainer.early_frames < 0 or not cfg.trainer.early_frame_loss_weight > 0.0:
        raise ConfigError(
            f"trainer.early_frames={cfg.trainer.early_frames} must be >= 0 and trainer.early_frame_loss_weight="
            f"{cfg.trainer.early_frame_loss_weight} > 0 (1.0 = plain CE), e.g. trainer.early_frame_loss_weight=4"
        )
    if cfg.model.mot.caption_cond_rank < 0:
        raise ConfigError(
            f"model.mot.caption_cond_rank={cfg.model.mot.caption_cond_rank} must be >= 0 (0 = off), "
            f"e.g. model.mot.caption_cond_rank=64"
        )
    if not 0.0 <= cfg.data.start_crop_prob <= 1.0:
        raise ConfigError(
            f"data.start_crop_prob={cfg.data.start_crop_prob} must be in [0, 1], e.g. data.start_crop_prob=0.25"
        )
    if not 0.0 <= cfg.data.caption_word_dropout < 1.0:
        raise ConfigError(
            f"data.caption_word_dropout={cfg.data.caption_word_dropout} must be in [0, 1), "
            f"e.g. data.caption_word_dropout=0.2"
        )
    if not 0.0 <= cfg.optimizer.min_lr_ratio <= 1.0:
        raise ConfigError(f"optimizer.min_lr_ratio={cfg.optimizer.min_lr_ratio} must be in [0, 1]")
    if len(cfg.optimizer.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optimizer.betas):
        raise ConfigError(f"optimizer.betas={list(cfg.optimizer.betas)} must be two values in [0, 1), e.g. [0.9,0.95]")
    if cfg.data.max_caption_tokens + 4 >= cfg.data.max_seq_len:
        raise ConfigError(
            f"data.max_caption_tokens={cfg.data.max_caption_tokens} leaves no room for audio in "
            f"data.max_seq_len={cfg.data.max_seq_len}; raise data.max_seq_len or lower data.max_caption_tokens"
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


# model.mot's keys of the musicgen tower's caption path and their defaults (what the llm tower requires them to be)
MUSICGEN_TOWER_DEFAULTS = {
    "caption_init": "zero_proj",
    "caption_projection": "per_layer",
    "caption_layer": -1,
    "cross_attention": "train",
}


def _check_musicgen_tower(cfg: TrainConfig) -> None:
    """audio_tower=musicgen runs MusicGen's own attention, tables and heads: the llm tower's knobs must stay at their
    defaults, and the pattern is MusicGen's delay; its caption-path keys agree with each other, and the llm tower leaves
    them at their defaults."""
    mot = cfg.model.mot
    if mot.audio_tower != "musicgen":
        own = [f"model.mot.{k}={getattr(mot, k)}" for k, v in MUSICGEN_TOWER_DEFAULTS.items() if getattr(mot, k) != v]
        if own:
            raise ConfigError(
                f"{', '.join(own)} belong to model.mot.audio_tower=musicgen's caption path: set "
                f"model.mot.audio_tower=musicgen, or drop them for audio_tower={mot.audio_tower}"
            )
        return
    if mot.caption_projection == "shared" and mot.layer_map is not None:
        raise ConfigError(
            "model.mot.layer_map lists a Llama layer per MusicGen layer, but model.mot.caption_projection=shared reads "
            "one (model.mot.caption_layer): drop model.mot.layer_map or set model.mot.caption_projection=per_layer"
        )
    if mot.caption_projection != "shared" and mot.caption_layer != -1:
        raise ConfigError(
            f"model.mot.caption_layer={mot.caption_layer} applies to model.mot.caption_projection=shared only "
            f"(per_layer reads model.mot.layer_map): set model.mot.caption_projection=shared or drop caption_layer"
        )
    off = {
        "data.pattern": (cfg.data.pattern, "delay"),
        "model.mot.audio_attention": (mot.audio_attention, "shared"),
        "model.mot.lora_rank": (mot.lora_rank, 0),
        "model.mot.caption_cond_rank": (mot.caption_cond_rank, 0),
        "model.mot.audio_embed_init": (mot.audio_embed_init, "musicgen"),
        "model.mot.audio_head_init": (mot.audio_head_init, "musicgen"),
        "model.mot.freeze_audio_ffn": (mot.freeze_audio_ffn, True),
    }
    bad = [f"{k}={have}" for k, (have, want) in off.items() if have != want]
    if bad:
        raise ConfigError(
            f"model.mot.audio_tower=musicgen runs MusicGen's own layers, tables and heads, so {', '.join(bad)} "
            f"cannot apply: set them back ("
            + " ".join(f"{k}={want}" for k, (have, want) in off.items() if have != want)
            + ") or use model.mot.audio_tower=llm"
        )


def mot_fields(cfg: TrainConfig) -> dict[str, Any]:
    """model.mot as plain kwargs for `adapter_trainer.model.mot.MoTConfig`."""
    return asdict(cfg.model.mot)


def schema_field_names() -> list[str]:
    """MoTSchema field names (a test compares them with MoTConfig's, to catch drift)."""
    return [f.name for f in fields(MoTSchema)]

"""Stage: mono waveforms -> EnCodec codes, int16 `[T, K]` frame-major (the one stored layout).

Only un-chunked, un-normalized codecs are accepted, so EnCodec's `audio_codes` `(nb_chunks=1, B, K, T)` loses its
chunk dim here and nowhere else. `encode_batch` runs in IEEE float32 (TF32 off): codes are identical for the same
device, dtype, batch composition and thread count, which the manifest records.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from ..shards.write_shards import sha256_file
from .hub_source import local_files_only

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEVICES = ("auto", "cpu", "cuda", "mps")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
OFFLINE_FIX = (
    "Pass a local directory written by `EncodecModel.save_pretrained` (codec.name_or_path=/path/to/encodec_32khz), "
    "get the Hub's files with `hf download facebook/encodec_32khz`, or build the offline demo codec with `make codec` "
    "(build/demo/codec)."
)


# codec.batch_size=auto: clips per forward pass per device type. A table, not a timed probe: the batch is part of a
# shard set's config, so it must not vary with the machine's load (docs/benchmarks.md has the encode figures).
AUTO_BATCH_SIZE = {"cpu": 1, "cuda": 8, "mps": 8}


def resolve_batch_size(batch_size: int | str, device_type: str) -> int:
    """The clips per forward pass for `codec.batch_size`: an int >= 1 as is, `auto` from AUTO_BATCH_SIZE; else
    ConfigError."""
    if batch_size == "auto":
        return AUTO_BATCH_SIZE[device_type]
    if isinstance(batch_size, str) and batch_size.strip().isdigit():
        batch_size = int(batch_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"codec.batch_size={batch_size!r} must be an integer >= 1 or auto")
    return batch_size


# The config.json fields of an EncodecModel that change what it computes from given weights; recorded in the
# manifest (`codec.config`) and compared by decode. Bookkeeping and output flags are left out.
IDENTITY_CONFIG_FIELDS = (
    "sampling_rate", "audio_channels", "normalize", "chunk_length_s", "overlap", "target_bandwidths",
    "hidden_size", "num_filters", "num_residual_layers", "upsampling_ratios", "norm_type", "kernel_size",
    "last_kernel_size", "residual_kernel_size", "dilation_growth_rate", "use_causal_conv", "pad_mode", "compress",
    "num_lstm_layers", "trim_right_ratio", "codebook_size", "codebook_dim", "use_conv_shortcut",
)  # fmt: skip


def config_identity(config) -> dict:
    """`IDENTITY_CONFIG_FIELDS` of an EncodecConfig as plain JSON values (tuples as lists)."""
    d = config.to_dict()
    return {k: list(d[k]) if isinstance(d.get(k), tuple) else d.get(k) for k in IDENTITY_CONFIG_FIELDS}


def resolve_device(device: str) -> torch.device:
    """'auto' picks cuda > mps > cpu; an explicit device that is not available is an error."""
    if device not in DEVICES:
        raise ConfigError(f"codec.device={device!r} is not one of {DEVICES}")
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if has_mps else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("codec.device=cuda but torch sees no CUDA device here; use codec.device=auto or cpu")
    if device == "mps" and not has_mps:
        raise ConfigError("codec.device=mps but MPS is not available here; use codec.device=auto or cpu")
    return torch.device(device)


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """Inside: TF32 off for CUDA matmuls and cuDNN convolutions/RNNs; the previous settings are restored.

    Uses the `fp32_precision` API where torch has it, else the `allow_tf32` flags (torch refuses mixing the two).
    """
    b = torch.backends
    if hasattr(getattr(b.cudnn, "conv", None), "fp32_precision"):
        knobs = [b.cuda.matmul, b.cudnn.conv, b.cudnn.rnn]
        prev = [k.fp32_precision for k in knobs]
        for k in knobs:
            k.fp32_precision = "ieee"
        try:
            yield
        finally:
            for k, p in zip(knobs, prev):
                k.fp32_precision = p
    else:
        prev_flags = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32)
        b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = False
        try:
            yield
        finally:
            b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = prev_flags


def hash_weight_files(model_dir: Path) -> str:
    """sha256 over the bytes of the weight files in `model_dir` (sorted by name, hashed back to back)."""
    files = sorted(p for p in Path(model_dir).iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise ConfigError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) in codec directory {model_dir}")
    return sha256_file(*files)


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


def _local_model_dir(name_or_path: str) -> Path:
    """The directory holding the weights: the path itself, or the hub cache snapshot (no download)."""
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        return p
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name_or_path, local_files_only=True))


class CodecEncoder:
    """Loads an `EncodecModel` (a hub id the Hub serves or the local cache holds, or a `save_pretrained` directory)
    and turns batches of mono waveforms into `[T, K]` int16 codes; the arguments are `CodecConfig`'s.

    pad_batches=False runs clips of different length in separate forward passes, so batching never changes a code.
    True pads them to the longest with `padding_mask`: faster on a GPU when lengths jitter, but EnCodec's non-causal
    convolutions then see zeros instead of their own edge padding, which can change the last frames of shorter clips.

    Raises:
        ConfigError: weights not found (the message says how to get them), unsupported dtype/device/bandwidth, or a
            normalizing/chunked/multi-channel codec.
    """

    def __init__(
        self,
        name_or_path: str,
        *,
        device: str = "auto",
        dtype: str = "float32",
        bandwidth_kbps: float | None = None,
        pad_batches: bool = False,
    ) -> None:
        from transformers import EncodecModel

        if dtype not in DTYPES:
            raise ConfigError(f"codec.dtype={dtype!r} is not supported; use one of {sorted(DTYPES)} (float32 default)")
        self.name_or_path = str(name_or_path)
        self.device = resolve_device(device)
        self.dtype = dtype
        self.pad_batches = pad_batches
        if _looks_like_path(self.name_or_path) and not Path(self.name_or_path).expanduser().is_dir():
            raise ConfigError(f"codec directory {self.name_or_path} does not exist. {OFFLINE_FIX}")
        # a Hub id: asked once whether the Hub serves it, else read from the cache (codec/hub_source.py)
        hub = (
            {}
            if Path(self.name_or_path).expanduser().is_dir()
            else {"local_files_only": local_files_only(self.name_or_path)}
        )
        try:
            model = EncodecModel.from_pretrained(self.name_or_path, **hub)
        except OSError as e:
            raise ConfigError(f"cannot load EnCodec weights {self.name_or_path!r}: {e}\n{OFFLINE_FIX}") from e
        cfg = model.config
        if cfg.normalize:
            raise ConfigError(
                f"codec {self.name_or_path} has normalize=True: it returns per-chunk audio_scales that codes alone "
                "cannot carry. Scaled codec not supported; use a codec with normalize=False (e.g. facebook/encodec_32khz)."
            )
        if cfg.chunk_length_s is not None:
            raise ConfigError(
                f"codec {self.name_or_path} encodes in chunks (chunk_length_s={cfg.chunk_length_s}); only un-chunked "
                "codecs (chunk_length_s=None, e.g. facebook/encodec_32khz) give one [T, K] code matrix per clip."
            )
        if cfg.audio_channels != 1:
            raise ConfigError(
                f"codec {self.name_or_path} expects {cfg.audio_channels} channels; this pipeline encodes mono"
            )
        allowed = [float(b) for b in cfg.target_bandwidths]
        bw = allowed[0] if bandwidth_kbps is None else float(bandwidth_kbps)
        if bw not in allowed:
            raise ConfigError(
                f"codec.bandwidth_kbps={bandwidth_kbps} is not supported by {self.name_or_path}; allowed: {allowed}"
            )
        self.bandwidth_kbps = bw
        self._check_feature_extractor(cfg.sampling_rate)
        self.model = model.to(device=self.device, dtype=DTYPES[dtype]).eval()
        self._config = cfg
        self.sampling_rate, self.hop_length = int(cfg.sampling_rate), int(cfg.hop_length)
        self.frame_rate, self.codebook_size = int(cfg.frame_rate), int(cfg.codebook_size)
        self.device_type = self.device.type  # recorded in the manifest (codes can differ in near-ties across devices)
        self.n_codebooks = int(model.quantizer.get_num_quantizers_for_bandwidth(bw))
        if cfg.codebook_size > np.iinfo(np.int16).max + 1:
            raise ConfigError(f"codebook_size={cfg.codebook_size} does not fit the int16 code layout")
        self._weights_sha256: str | None = None

    def _check_feature_extractor(self, model_sr: int) -> None:
        """A saved feature extractor, if any, must agree with the model on rate and channels."""
        p = Path(self.name_or_path).expanduser()
        if not (p / "preprocessor_config.json").is_file():
            return
        from transformers import EncodecFeatureExtractor

        fe = EncodecFeatureExtractor.from_pretrained(str(p))
        if fe.sampling_rate != model_sr or fe.feature_size != 1:
            raise ConfigError(
                f"{p}/preprocessor_config.json says sampling_rate={fe.sampling_rate}, feature_size={fe.feature_size} "
                f"but the model expects {model_sr} Hz mono; re-save the codec directory"
            )

    @property
    def num_threads(self) -> int:
        """Intra-op CPU threads torch uses now (`torch.get_num_threads()`), recorded in the manifest."""
        return int(torch.get_num_threads())

    @property
    def config_identity(self) -> dict:
        """The config.json fields that change the computation (`IDENTITY_CONFIG_FIELDS`), for the manifest."""
        return config_identity(self._config)

    @property
    def weights_sha256(self) -> str:
        if self._weights_sha256 is None:
            self._weights_sha256 = hash_weight_files(_local_model_dir(self.name_or_path))
        return self._weights_sha256

    def n_frames(self, n_samples: int) -> int:
        """Code frames EnCodec produces for `n_samples` samples: ceil(n_samples / hop_length)."""
        return math.ceil(n_samples / self.hop_length)

    @torch.inference_mode()
    def encode_batch(self, wavs: list[torch.Tensor]) -> list[np.ndarray]:
        """Mono `[N_i]` float clips at `sampling_rate` -> int16 `[T_i, K]` codes, `T_i = ceil(N_i / hop_length)`, in
        input order."""
        if not wavs:
            return []
        out: list[np.ndarray | None] = [None] * len(wavs)
        if self.pad_batches:
            groups = [list(range(len(wavs)))]
        else:  # one forward pass per distinct length, first-seen order
            by_len: dict[int, list[int]] = {}
            for i, w in enumerate(wavs):
                by_len.setdefault(int(w.shape[-1]), []).append(i)
            groups = list(by_len.values())
        with ieee_float32():
            for idx in groups:
                for i, codes in zip(idx, self._encode_padded([wavs[i] for i in idx])):
                    out[i] = codes
        return out  # type: ignore[return-value]

    def _encode_padded(self, wavs: list[torch.Tensor]) -> list[np.ndarray]:
        lengths = [int(w.shape[-1]) for w in wavs]
        n_max = max(lengths)
        x = torch.zeros(len(wavs), 1, n_max, dtype=DTYPES[self.dtype])  # [B, 1, N]
        mask = torch.zeros(len(wavs), 1, n_max, dtype=torch.bool)  # [B, 1, N]
        for b, (w, n) in enumerate(zip(wavs, lengths)):
            x[b, 0, :n] = w.reshape(-1).to(x.dtype)
            mask[b, 0, :n] = True
        enc = self.model.encode(
            x.to(self.device), padding_mask=mask.to(self.device), bandwidth=self.bandwidth_kbps, return_dict=True
        )
        assert all(s is None for s in enc.audio_scales), "Scaled codec not supported (audio_scales must be None)"
        codes = enc.audio_codes  # [1, B, K, T]
        if codes.shape[0] != 1 or codes.shape[2] != self.n_codebooks:
            raise RuntimeError(f"expected audio_codes [1, B, {self.n_codebooks}, T], got {tuple(codes.shape)}")
        codes = codes[0].transpose(1, 2).to("cpu", torch.int16)  # [1, B, K, T] -> [B, T, K]
        result = []
        for b, n in enumerate(lengths):
            t = self.n_frames(n)
            if t > codes.shape[1]:
                raise RuntimeError(f"codec returned {codes.shape[1]} frames for {n} samples, expected {t}")
            result.append(np.ascontiguousarray(codes[b, :t].numpy()))  # [T_b, K]
        return result

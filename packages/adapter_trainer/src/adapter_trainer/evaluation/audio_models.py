"""The pretrained audio models that judge decoded audio, loaded offline with their transformers classes, checked.

- CLAP (`ClapModel` + `ClapProcessor`, default laion/larger_clap_music): text and audio embeddings in one space,
  fed at the feature extractor's sampling rate (48 kHz). Texts are cut at 77 tokens (LAION CLAP's and
  audiocraft's `max_length=77`), not at the text model's 512 positions.
- An AudioSet classifier (`ASTForAudioClassification` + `ASTFeatureExtractor`, default
  MIT/ast-finetuned-audioset-10-10-0.4593, 16 kHz): label distributions for the KL. audiocraft uses PaSST, which
  is not in transformers; AST is the AudioSet classifier that is.

Models load with `from_pretrained(..., local_files_only=True, output_loading_info=True)` from a local directory
or the local Hugging Face cache: nothing is downloaded. A model is refused (one line) when its config is of
another type (a CLAP directory passed as the classifier, or the reverse), when weights were missing from the
checkpoint (they would be random), or when the classifier's labels are not AudioSet's 527.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adapter_trainer.errors import UserError

DEFAULT_CLAP = "laion/larger_clap_music"
DEFAULT_CLASSIFIER = "MIT/ast-finetuned-audioset-10-10-0.4593"
CLAP_TEXT_MAX_TOKENS = 77  # LAION CLAP's tokenizer and audiocraft's clap_consistency.py: max_length=77
AUDIOSET_LABELS = 527  # the KL compares distributions over AudioSet's ontology
CLAP_TYPE, AST_TYPE = "clap", "audio-spectrogram-transformer"  # config.json model_type of each
CLASSIFIER_MIN_SECONDS = 0.15  # shorter trailing segments are dropped (audiocraft's PaSST KL does the same)
AST_FRAME_SHIFT_S = 0.010  # ASTFeatureExtractor's fbank hop: max_length frames = max_length * 10 ms of audio
FADTK_HOP_S = 1.0  # fadtk's clap-laion-* embeddings: 10-s windows every second, the last ones zero-padded


class ModelUnavailableError(UserError, OSError):
    """A model is neither a local directory nor in the local Hugging Face cache; the message says how to get it."""


class WrongModelError(UserError, ValueError):
    """A model directory holds another kind of model, incomplete weights, or another label set."""


def how_to_get(name: str) -> str:
    """The one line that says how to make `name` available offline."""
    return (
        f"model {name!r} is not available offline (neither a local directory nor in the Hugging Face cache); on a "
        f"networked machine run `hf download {name}` (`huggingface-cli download` before huggingface_hub 1.0) and "
        f"copy ~/.cache/huggingface here (or set HF_HOME), or pass a local directory saved with save_pretrained"
    )


def is_available(name: str) -> bool:
    """Cheap check, nothing loaded: `name` is a directory with a config.json, or a hub id whose config.json is in
    the local cache."""
    return _config_path(name) is not None


def _config_path(name: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    path = Path(name)
    if path.is_dir():
        return path / "config.json" if (path / "config.json").is_file() else None
    if path.exists() or name.count("/") > 1:  # a file, or a path that is not a hub id
        return None
    try:
        found = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(found) if isinstance(found, str) else None


def _load(name: str, load: Any, **kwargs: Any) -> Any:
    """`load(name, local_files_only=True, **kwargs)`, with a missing model turned into ModelUnavailableError."""
    if not is_available(name):
        raise ModelUnavailableError(how_to_get(name))
    try:
        return load(name, local_files_only=True, **kwargs)
    except OSError as e:  # a cached config but missing weights / processor files
        raise ModelUnavailableError(f"{how_to_get(name)} ({type(e).__name__}: {str(e).splitlines()[0]})") from e


def check_model_type(name: str, option: str, want: str, what: str) -> dict[str, Any]:
    """config.json of `name` -> its dict, refused unless its model_type is `want` (read before any weights load)."""
    path = _config_path(name)
    if path is None:
        raise ModelUnavailableError(how_to_get(name))
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WrongModelError(f"{option} {name}: {path} is not JSON ({e}); download or save the model again") from e
    got = config.get("model_type") if isinstance(config, dict) else None
    if got != want:
        raise WrongModelError(
            f"{option} {name} is a {got!r} model, not {what} (model_type {want!r}); pass {what} directory or hub id"
        )
    return config


def check_classifier_config(name: str) -> None:
    """--classifier's config.json: an AST with AudioSet's 527 labels (read before any weights load)."""
    config = check_model_type(name, "--classifier", AST_TYPE, "an AST AudioSet classifier")
    n_labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))  # 2: transformers' default
    if n_labels != AUDIOSET_LABELS:
        raise WrongModelError(
            f"--classifier {name} has {n_labels} labels, not AudioSet's {AUDIOSET_LABELS}: the KL compares "
            f"AudioSet label distributions; pass an AudioSet classifier (default {DEFAULT_CLASSIFIER})"
        )


def check_loading_info(name: str, option: str, info: dict[str, Any]) -> None:
    """Refuse a checkpoint that left weights at their random initialisation (missing or mismatched keys)."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(k) for k in (info.get("mismatched_keys") or []))
    if missing or mismatched:
        first = (missing or mismatched)[0]
        raise WrongModelError(
            f"{option} {name}: {len(missing)} weight(s) missing and {len(mismatched)} of another shape in the "
            f"checkpoint (first: {first}), which would stay random; pass the complete model saved with save_pretrained"
        )


def _pooled(out: Any) -> torch.Tensor:
    """get_*_features output -> [B, D]: a BaseModelOutputWithPooling in transformers 5 (pooler_output holds the
    projected, normalised embedding), a plain tensor in 4.x."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def clip_seed(seed: int, key: str) -> int:
    """The crop seed of one clip: from --seed and the clip's own key, so no other clip changes its crop."""
    return zlib.crc32(f"{seed}:{key}".encode()) & 0xFFFFFFFF


@dataclass
class Clap:
    """A CLAP model and its processor, in eval mode on `device`."""

    name: str
    model: Any  # transformers.ClapModel
    processor: Any  # transformers.ClapProcessor
    device: torch.device

    @classmethod
    def load(cls, name: str, device: torch.device) -> Clap:
        from transformers import ClapModel, ClapProcessor

        check_model_type(name, "--clap", CLAP_TYPE, "a CLAP model")
        processor = _load(name, ClapProcessor.from_pretrained)
        model, info = _load(name, ClapModel.from_pretrained, output_loading_info=True)
        check_loading_info(name, "--clap", info)
        return cls(name=name, model=model.eval().to(device), processor=processor, device=device)

    @property
    def sample_rate(self) -> int:
        return int(self.processor.feature_extractor.sampling_rate)

    @property
    def window_samples(self) -> int:
        """The audio one embedding sees (nb_max_samples: 10 s at 48 kHz for LAION's models)."""
        return int(self.processor.feature_extractor.nb_max_samples)

    def text_max_tokens(self, max_tokens: int = CLAP_TEXT_MAX_TOKENS) -> int:
        """Tokens kept of a caption: max_tokens, or fewer when the text model has fewer positions (RoBERTa-style
        positions start after the padding index: max_position_embeddings - 2 fit)."""
        return min(max_tokens, self.model.config.text_config.max_position_embeddings - 2)

    @torch.no_grad()
    def text_embeddings(
        self, texts: list[str], max_tokens: int = CLAP_TEXT_MAX_TOKENS, batch_size: int = 16
    ) -> np.ndarray:
        """texts -> L2-normalised embeddings [N, D] float64, each text cut at text_max_tokens(max_tokens) tokens."""
        max_length = self.text_max_tokens(max_tokens)
        out = []
        for i in range(0, len(texts), batch_size):
            tok = self.processor.tokenizer(
                texts[i : i + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            ).to(self.device)  # input_ids [b, L <= max_length]
            emb = _pooled(
                self.model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
            )
            out.append(torch.nn.functional.normalize(emb.float(), dim=-1).cpu().double().numpy())  # [b, D]
        return np.concatenate(out)  # [N, D]

    def _features(self, wave: np.ndarray, seed: int) -> dict[str, torch.Tensor]:
        """One clip [N] -> the extractor's features with batch 1; a clip longer than the window is cropped at
        random by ClapFeatureExtractor (global numpy RNG), seeded here with the clip's own seed."""
        state = np.random.get_state()
        np.random.seed(seed)
        try:
            feats = self.processor.feature_extractor([wave], sampling_rate=self.sample_rate, return_tensors="pt")
        finally:
            np.random.set_state(state)
        # truncation="fusion" marks a random clip `is_longer` when none of the batch is (a training trick): the
        # clip's own length decides here (fusion models only read it)
        feats["is_longer"] = torch.tensor([[len(wave) > self.window_samples]])  # [1, 1] bool
        return feats  # input_features [1, 1 or 4, frames, mels]

    @torch.no_grad()
    def audio_embeddings(self, waves: list[np.ndarray], seeds: list[int], batch_size: int = 8) -> np.ndarray:
        """mono waveforms [N_i] at `sample_rate` -> L2-normalised embeddings [N, D] float64, one per clip.

        seeds[i] fixes clip i's random crop when it is longer than the window (clip_seed: from --seed and its key),
        so a clip's embedding depends on nothing but the clip."""
        out = []
        for i in range(0, len(waves), batch_size):
            feats = [self._features(w, s) for w, s in zip(waves[i : i + batch_size], seeds[i : i + batch_size])]
            batch = {k: torch.cat([f[k] for f in feats]).to(self.device) for k in ("input_features", "is_longer")}
            emb = _pooled(self.model.get_audio_features(**batch))  # [b, D]
            out.append(torch.nn.functional.normalize(emb.float(), dim=-1).cpu().double().numpy())
        return np.concatenate(out)  # [N, D]

    def fadtk_windows(self, wave: np.ndarray, hop_s: float = FADTK_HOP_S) -> list[np.ndarray]:
        """fadtk's clap-laion-* windowing of one clip [N]: int16-quantised, a window of `window_samples` starting
        at every hop (the last ones running past the end zero-padded) -> windows [window_samples] each."""
        q = (np.clip(wave, -1.0, 1.0) * 32767.0).astype(np.int16).astype(np.float32) / 32767.0  # [N]
        win, hop = self.window_samples, int(hop_s * self.sample_rate)
        return [np.pad(q[i : i + win], (0, max(0, win - len(q[i : i + win])))) for i in range(0, len(q), hop)]

    @torch.no_grad()
    def window_embeddings(self, waves: list[np.ndarray], batch_size: int = 8) -> np.ndarray:
        """mono waveforms at `sample_rate` -> embeddings [sum of windows, D] of fadtk_windows (full windows: no
        random crop, so no seed)."""
        windows = [w for wave in waves for w in self.fadtk_windows(wave)]
        return self.audio_embeddings(windows, seeds=[0] * len(windows), batch_size=batch_size)  # [W, D]


@dataclass
class Classifier:
    """An AudioSet classifier (ASTForAudioClassification) and its feature extractor, in eval mode on `device`."""

    name: str
    model: Any  # transformers.ASTForAudioClassification
    extractor: Any  # transformers.ASTFeatureExtractor
    device: torch.device

    @classmethod
    def load(cls, name: str, device: torch.device) -> Classifier:
        from transformers import ASTFeatureExtractor, ASTForAudioClassification

        check_classifier_config(name)
        extractor = _load(name, ASTFeatureExtractor.from_pretrained)
        model, info = _load(name, ASTForAudioClassification.from_pretrained, output_loading_info=True)
        check_loading_info(name, "--classifier", info)
        return cls(name=name, model=model.eval().to(device), extractor=extractor, device=device)

    @property
    def sample_rate(self) -> int:
        return int(self.extractor.sampling_rate)

    @property
    def segment_seconds(self) -> float:
        """The audio one forward sees (10.24 s for the AudioSet AST); longer clips are cut into segments, shorter
        segments are padded to it by ASTFeatureExtractor (zero filterbank frames)."""
        return float(self.extractor.max_length) * AST_FRAME_SHIFT_S

    @property
    def labels(self) -> list[str]:
        return [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]

    def segments(self, wave: np.ndarray) -> list[np.ndarray]:
        """[N] -> consecutive segments of at most segment_seconds; trailing ones under CLASSIFIER_MIN_SECONDS are
        dropped unless the clip has no other (audiocraft splits PaSST's input the same way instead of padding)."""
        seg = max(1, int(self.segment_seconds * self.sample_rate))
        parts = [wave[i : i + seg] for i in range(0, max(1, len(wave)), seg)]
        keep = [p for p in parts if len(p) > CLASSIFIER_MIN_SECONDS * self.sample_rate]
        return keep or parts[:1]

    @torch.no_grad()
    def segment_distributions(self, waves: list[np.ndarray], batch_size: int = 8) -> list[np.ndarray]:
        """mono waveforms at `sample_rate` -> per clip [S_i, L] float64: softmax over the label logits of each of
        its segments (audiocraft's KL takes softmax of PaSST's logits)."""
        segs = [(i, s) for i, w in enumerate(waves) for s in self.segments(w)]
        rows: list[list[np.ndarray]] = [[] for _ in waves]
        for j in range(0, len(segs), batch_size):
            chunk = segs[j : j + batch_size]
            feats = self.extractor([s for _, s in chunk], sampling_rate=self.sample_rate, return_tensors="pt").to(
                self.device
            )  # input_values [b, max_length, mels]
            p = torch.softmax(self.model(**feats).logits.float(), dim=-1).cpu().double().numpy()  # [b, L]
            for (i, _), row in zip(chunk, p):
                rows[i].append(row)
        return [np.stack(r) for r in rows]  # [S_i, L] each

    def label_distributions(self, waves: list[np.ndarray], batch_size: int = 8) -> np.ndarray:
        """mono waveforms -> [N, L]: each clip's segment distributions averaged (for the top labels shown)."""
        return np.stack([d.mean(axis=0) for d in self.segment_distributions(waves, batch_size)])  # [N, L]


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cpu', 'cuda', 'cuda:N' checked against this machine."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UserError(f"--device {name!r} is not a device ({e}); use cpu, cuda, cuda:N or auto") from e
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name!r}: only cpu, cuda, cuda:N and auto are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA GPU is visible on this machine; use --device cpu (or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s); use cuda:0..")
    return device

"""The pretrained audio models that judge decoded audio (CLAP; an AudioSet AST classifier for the KL), loaded offline.

Nothing is downloaded; a model of another type, with missing weights or (the classifier) without AudioSet's 527
labels is refused in one line.
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
CLAP_TEXT_MAX_TOKENS = 77  # LAION CLAP's and audiocraft's max_length
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
    """`name` is a directory with a config.json, or a hub id whose config.json is in the local cache (nothing loaded)."""
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


def _load_pretrained(
    name: str, option: str, preprocessor_cls: Any, model_cls: Any, device: torch.device
) -> tuple[Any, Any]:
    """(preprocessor, model in eval mode on `device`) of `name` from local files: a missing model is
    ModelUnavailableError; weights that would stay random (missing or mismatched keys) are WrongModelError."""
    if not is_available(name):
        raise ModelUnavailableError(how_to_get(name))
    try:
        preprocessor = preprocessor_cls.from_pretrained(name, local_files_only=True)
        model, info = model_cls.from_pretrained(name, local_files_only=True, output_loading_info=True)
    except OSError as e:  # a cached config but missing weights / processor files
        raise ModelUnavailableError(f"{how_to_get(name)} ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(k) for k in (info.get("mismatched_keys") or []))
    if missing or mismatched:
        first = (missing or mismatched)[0]
        raise WrongModelError(
            f"{option} {name}: {len(missing)} weight(s) missing and {len(mismatched)} of another shape in the "
            f"checkpoint (first: {first}), which would stay random; pass the complete model saved with save_pretrained"
        )
    return preprocessor, model.eval().to(device)


def _pooled(out: Any) -> torch.Tensor:
    """get_*_features output -> [B, D] (a BaseModelOutputWithPooling in transformers 5, a tensor in 4.x)."""
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
        processor, model = _load_pretrained(name, "--clap", ClapProcessor, ClapModel, device)
        return cls(name=name, model=model, processor=processor, device=device)

    @property
    def sample_rate(self) -> int:
        return int(self.processor.feature_extractor.sampling_rate)

    @property
    def window_samples(self) -> int:
        """The audio one embedding sees (nb_max_samples: 10 s at 48 kHz for LAION's models)."""
        return int(self.processor.feature_extractor.nb_max_samples)

    def text_max_tokens(self, max_tokens: int = CLAP_TEXT_MAX_TOKENS) -> int:
        """Tokens kept of a caption: max_tokens, or fewer when the text model has fewer (RoBERTa-style) positions."""
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
        """One clip [N] -> the extractor's features, batch 1; ClapFeatureExtractor's random crop (global numpy RNG)
        of a clip longer than the window is seeded with the clip's own seed."""
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
        """mono waveforms [N_i] at `sample_rate` -> L2-normalised embeddings [N, D] float64; seeds[i] fixes clip i's
        random crop (`clip_seed`)."""
        out = []
        for i in range(0, len(waves), batch_size):
            feats = [self._features(w, s) for w, s in zip(waves[i : i + batch_size], seeds[i : i + batch_size])]
            batch = {k: torch.cat([f[k] for f in feats]).to(self.device) for k in ("input_features", "is_longer")}
            emb = _pooled(self.model.get_audio_features(**batch))  # [b, D]
            out.append(torch.nn.functional.normalize(emb.float(), dim=-1).cpu().double().numpy())
        return np.concatenate(out)  # [N, D]

    def fadtk_windows(self, wave: np.ndarray, hop_s: float = FADTK_HOP_S) -> list[np.ndarray]:
        """fadtk's clap-laion-* windowing of one clip [N]: int16-quantised windows [window_samples] every hop, the
        last ones zero-padded."""
        q = (np.clip(wave, -1.0, 1.0) * 32767.0).astype(np.int16).astype(np.float32) / 32767.0  # [N]
        win, hop = self.window_samples, int(hop_s * self.sample_rate)
        return [np.pad(q[i : i + win], (0, max(0, win - len(q[i : i + win])))) for i in range(0, len(q), hop)]

    @torch.no_grad()
    def window_embeddings(self, waves: list[np.ndarray], batch_size: int = 8) -> np.ndarray:
        """mono waveforms at `sample_rate` -> embeddings [sum of windows, D] of fadtk_windows (no crop, no seed)."""
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
        extractor, model = _load_pretrained(
            name, "--classifier", ASTFeatureExtractor, ASTForAudioClassification, device
        )
        return cls(name=name, model=model, extractor=extractor, device=device)

    @property
    def sample_rate(self) -> int:
        return int(self.extractor.sampling_rate)

    @property
    def segment_seconds(self) -> float:
        """The audio one forward sees; ASTFeatureExtractor pads shorter segments to it."""
        return float(self.extractor.max_length) * AST_FRAME_SHIFT_S

    @property
    def labels(self) -> list[str]:
        return [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]

    def segments(self, wave: np.ndarray) -> list[np.ndarray]:
        """[N] -> consecutive segments of at most segment_seconds; trailing ones under CLASSIFIER_MIN_SECONDS dropped
        unless the clip has no other (as audiocraft splits PaSST's input)."""
        seg = max(1, int(self.segment_seconds * self.sample_rate))
        parts = [wave[i : i + seg] for i in range(0, max(1, len(wave)), seg)]
        keep = [p for p in parts if len(p) > CLASSIFIER_MIN_SECONDS * self.sample_rate]
        return keep or parts[:1]

    @torch.no_grad()
    def segment_distributions(self, waves: list[np.ndarray], batch_size: int = 8) -> list[np.ndarray]:
        """mono waveforms at `sample_rate` -> per clip [S_i, L] float64: softmax of each segment's label logits."""
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

"""The pretrained audio models that judge decoded audio, loaded offline with their transformers classes.

- CLAP (`ClapModel` + `ClapProcessor`, default laion/larger_clap_music): text and audio embeddings in one space,
  fed at the feature extractor's sampling rate (48 kHz).
- An AudioSet classifier (`ASTForAudioClassification` + `ASTFeatureExtractor`, default
  MIT/ast-finetuned-audioset-10-10-0.4593, 16 kHz): label distributions for the KL. audiocraft uses PaSST, which
  is not in transformers; AST is the AudioSet classifier that is.

Models load with `from_pretrained(..., local_files_only=True)` from a local directory or the local Hugging Face
cache: nothing is downloaded. Wavs are read with soundfile, averaged to mono and resampled with soxr (the
pipeline's resampler; audio/read_audio.py there says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr
import torch

from adapter_trainer.errors import UserError

DEFAULT_CLAP = "laion/larger_clap_music"
DEFAULT_CLASSIFIER = "MIT/ast-finetuned-audioset-10-10-0.4593"
CLASSIFIER_MIN_SECONDS = 0.15  # shorter trailing segments are dropped (audiocraft's PaSST KL does the same)
AST_FRAME_SHIFT_S = 0.010  # ASTFeatureExtractor's fbank hop: max_length frames = max_length * 10 ms of audio


class ModelUnavailableError(UserError, OSError):
    """A model is neither a local directory nor in the local Hugging Face cache; the message says how to get it."""


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
    from huggingface_hub import try_to_load_from_cache

    path = Path(name)
    if path.is_dir():
        return (path / "config.json").is_file()
    if path.exists() or name.count("/") > 1:  # a file, or a path that is not a hub id
        return False
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def _load(name: str, load: Any) -> Any:
    """`load(name, local_files_only=True)`, with a missing model turned into ModelUnavailableError."""
    if not is_available(name):
        raise ModelUnavailableError(how_to_get(name))
    try:
        return load(name, local_files_only=True)
    except OSError as e:  # a cached config but missing weights / processor files
        raise ModelUnavailableError(f"{how_to_get(name)} ({type(e).__name__}: {str(e).splitlines()[0]})") from e


def read_mono(path: Path, sample_rate: int) -> np.ndarray:
    """A wav file -> mono float32 [N] at `sample_rate` (channels averaged, soxr VHQ resampling)."""
    wav, sr = sf.read(path, dtype="float32", always_2d=True)  # [N, C]
    mono = wav.mean(axis=1)  # [N]
    if sr != sample_rate:
        mono = soxr.resample(mono, sr, sample_rate, quality="VHQ")  # [N * sample_rate / sr]
    return np.ascontiguousarray(mono, dtype=np.float32)


def _pooled(out: Any) -> torch.Tensor:
    """get_*_features output -> [B, D]: a BaseModelOutputWithPooling in transformers 5 (pooler_output holds the
    projected, normalised embedding), a plain tensor in 4.x."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


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

        processor = _load(name, ClapProcessor.from_pretrained)
        model = _load(name, ClapModel.from_pretrained).eval().to(device)
        return cls(name=name, model=model, processor=processor, device=device)

    @property
    def sample_rate(self) -> int:
        return int(self.processor.feature_extractor.sampling_rate)

    @torch.no_grad()
    def text_embeddings(self, texts: list[str], batch_size: int = 16) -> np.ndarray:
        """texts -> L2-normalised embeddings [N, D] float64 (long captions truncated to the text model's positions)."""
        # RoBERTa-style positions start after the padding index: max_position_embeddings - 2 tokens fit (514 -> 512)
        max_length = min(
            self.processor.tokenizer.model_max_length, self.model.config.text_config.max_position_embeddings - 2
        )
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

    @torch.no_grad()
    def audio_embeddings(self, waves: list[np.ndarray], seed: int, batch_size: int = 8) -> np.ndarray:
        """mono waveforms [N_i] at `sample_rate` -> L2-normalised embeddings [N, D] float64.

        Clips longer than the extractor's max_length_s are cropped at random by ClapFeatureExtractor (global numpy
        RNG): it is seeded with `seed` here and restored afterwards, so a run is reproducible.
        """
        state = np.random.get_state()
        np.random.seed(seed)
        try:
            out = []
            for i in range(0, len(waves), batch_size):
                batch = waves[i : i + batch_size]
                feats = self.processor.feature_extractor(batch, sampling_rate=self.sample_rate, return_tensors="pt").to(
                    self.device
                )  # input_features [b, 1 or 4, frames, mels], is_longer [b, 1]
                # truncation="fusion" marks a random clip `is_longer` when none of the batch is (a training trick):
                # a clip's embedding would depend on its batch. Each clip's own length decides (fusion models only
                # read it).
                longer = [[len(w) > self.processor.feature_extractor.nb_max_samples] for w in batch]
                feats["is_longer"] = torch.tensor(longer, device=self.device)  # [b, 1] bool
                emb = _pooled(self.model.get_audio_features(**feats))  # [b, D]
                out.append(torch.nn.functional.normalize(emb.float(), dim=-1).cpu().double().numpy())
        finally:
            np.random.set_state(state)
        return np.concatenate(out)  # [N, D]


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

        extractor = _load(name, ASTFeatureExtractor.from_pretrained)
        model = _load(name, ASTForAudioClassification.from_pretrained).eval().to(device)
        return cls(name=name, model=model, extractor=extractor, device=device)

    @property
    def sample_rate(self) -> int:
        return int(self.extractor.sampling_rate)

    @property
    def segment_seconds(self) -> float:
        """The audio one forward sees (10.24 s for the AudioSet AST); longer clips are cut into segments."""
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
    def label_distributions(self, waves: list[np.ndarray], batch_size: int = 8) -> np.ndarray:
        """mono waveforms at `sample_rate` -> [N, L] float64: softmax over the label logits (audiocraft's KL takes
        softmax of PaSST's logits), averaged over a clip's segments."""
        segs = [(i, s) for i, w in enumerate(waves) for s in self.segments(w)]
        probs = np.zeros((len(waves), self.model.config.num_labels))  # [N, L]
        counts = np.zeros(len(waves))
        for j in range(0, len(segs), batch_size):
            chunk = segs[j : j + batch_size]
            feats = self.extractor([s for _, s in chunk], sampling_rate=self.sample_rate, return_tensors="pt").to(
                self.device
            )  # input_values [b, max_length, mels]
            p = torch.softmax(self.model(**feats).logits.float(), dim=-1).cpu().double().numpy()  # [b, L]
            for (i, _), row in zip(chunk, p):
                probs[i] += row
                counts[i] += 1
        return probs / counts[:, None]  # [N, L]


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else as torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)

"""Mel spectrogram PNGs of decoded clips for the listening page (torchaudio's MelSpectrogram + AmplitudeToDB,
drawn with matplotlib Agg).
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import torch

N_MELS = 64
N_FFT = 1024
TOP_DB = 80.0  # dynamic range drawn below each picture's loudest bin
WIDTH, HEIGHT = 320, 130  # px: two side by side fit the page's player column


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV (what tokenizer_pipeline.decode writes) -> (samples [N] float32 in [-1, 1], rate), channels
    averaged (the stdlib reader: adapter_trainer depends on no audio-file library)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(
                f"{path}: {8 * w.getsampwidth()}-bit samples; expected 16-bit PCM (tokenizer_pipeline.decode)"
            )
        rate, channels = w.getframerate(), w.getnchannels()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")  # [N * channels]
    return pcm.reshape(-1, channels).mean(axis=1).astype(np.float32) / 32768.0, rate  # [N]


def mel_db(samples: np.ndarray, rate: int) -> np.ndarray:
    """samples [N] -> log-mel power [N_MELS, frames] in dB (10 ms hop), clamped to TOP_DB below its maximum."""
    import torchaudio  # imported here: only the listening page draws spectrograms

    if samples.shape[0] < N_FFT:  # the centred STFT's reflect padding needs at least n_fft // 2 + 1 samples
        samples = np.pad(samples, (0, N_FFT - samples.shape[0]))  # [N_FFT]

    mel = torchaudio.transforms.MelSpectrogram(
        sample_rate=rate, n_fft=N_FFT, hop_length=max(1, rate // 100), n_mels=N_MELS, power=2.0
    )
    to_db = torchaudio.transforms.AmplitudeToDB(stype="power", top_db=TOP_DB)
    with torch.no_grad():
        return to_db(mel(torch.from_numpy(samples))).numpy()  # [N] -> [N_MELS, frames]


def save_spectrogram_png(wav: Path, png: Path, title: str) -> Path:
    """Draw `wav`'s mel spectrogram (time in s on x, mel bins on y, dB colour) into `png` (WIDTH x HEIGHT px)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, rate = read_wav(wav)
    db = mel_db(samples, rate)  # [N_MELS, frames]
    fig, ax = plt.subplots(figsize=(WIDTH / 100, HEIGHT / 100), dpi=100)
    seconds = samples.shape[0] / rate
    ax.imshow(db, origin="lower", aspect="auto", cmap="magma", extent=(0.0, seconds, 0, N_MELS),
              vmin=float(db.max()) - TOP_DB, vmax=float(db.max()))  # fmt: skip
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("s", fontsize=7, labelpad=1)
    ax.set_ylabel("mel bin", fontsize=7, labelpad=1)
    ax.tick_params(labelsize=6, length=2)
    fig.tight_layout(pad=0.3)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png

"""The stand-in corpus's synthesis: one clip rendered from its `ClipAttributes` and ytid, and its 16-bit PCM.

Each family has its own timbre (`_partials`); per-clip randomness comes from sha256(ytid), never `hash()`, so the
corpus is byte-identical across runs.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .standin_attributes import SCALES, ClipAttributes
from .standin_keywords import FAMILIES

SAMPLE_RATE = 44_100  # Hz, what yt-dlp + ffmpeg typically give for YouTube audio
DURATION_S = 10.0  # MusicCaps windows are 10 s
NOTES_PER_BEAT = 2  # melody notes are 8ths: note rate = 2 * bpm / 60
PEAK = 0.891  # -1 dBFS after peak normalisation
REGISTER_SHIFT = {"low": -12, "mid": 0, "high": 12}  # semitones


def clip_seed(ytid: str, seed: int = 0) -> int:
    """Stable 64-bit seed from the ytid (sha256; Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{ytid}".encode()).digest()[:8], "little")


# ---- synthesis ----
def _midi_hz(m: float) -> float:
    return 440.0 * 2.0 ** ((m - 69.0) / 12.0)


VOWELS = (  # (formant Hz, bandwidth Hz, gain) x 3: a, e, i, o, u
    ((730, 90, 1.0), (1090, 110, 0.5), (2440, 170, 0.25)),
    ((530, 60, 1.0), (1840, 100, 0.5), (2480, 120, 0.3)),
    ((270, 60, 1.0), (2290, 100, 0.35), (3010, 150, 0.25)),
    ((570, 80, 1.0), (840, 80, 0.6), (2410, 170, 0.15)),
    ((300, 60, 1.0), (870, 80, 0.4), (2240, 150, 0.1)),
)


def _partials(family: str, f0: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(freq ratio [H], amplitude [H], decay-rate multiplier [H]) of one note of `family`."""
    k = np.arange(1, 41, dtype=np.float64)  # [H]
    if family == "piano":
        k = k[:12]
        ratio, amp, decay = k * np.sqrt(1.0 + 4e-4 * k**2), k**-1.2, np.sqrt(k)
    elif family == "guitar":
        k = k[:14]
        ratio, amp, decay = k, np.abs(np.sin(np.pi * k * 0.18)) / k, k
    elif family == "strings":
        k = k[:18]
        ratio, amp, decay = k, 1.0 / k, np.zeros_like(k)
    elif family == "synth":
        k = k[0:23:2]  # odd harmonics: square wave
        ratio, amp, decay = k, 1.0 / k, np.zeros_like(k)
    elif family == "organ":
        k = np.array([1.0, 2.0, 3.0, 4.0, 6.0, 8.0])
        ratio, amp, decay = k, np.array([1.0, 0.8, 0.6, 0.5, 0.4, 0.3]), np.zeros_like(k)
    elif family == "wind":
        k = k[:3]
        ratio, amp, decay = k, np.array([1.0, 0.22, 0.07]), np.zeros_like(k)
    elif family == "brass":
        k = k[:16]
        ratio, amp, decay = k, k**-0.6, np.zeros_like(k)
    elif family == "bass":
        k = k[:5]
        ratio, amp, decay = k, np.array([1.0, 0.55, 0.3, 0.15, 0.08]), 0.5 * k
    elif family == "vocal":
        k = k[: max(1, int(4000.0 // f0))]
        formants = VOWELS[int(rng.integers(len(VOWELS)))]
        fk = k * f0
        env = sum(g / (1.0 + ((fk - fc) / bw) ** 2) for fc, bw, g in formants)
        ratio, amp, decay = k, env / k**0.5 + 0.01, np.zeros_like(k)
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    keep = ratio * f0 < 0.45 * SAMPLE_RATE
    return ratio[keep], amp[keep], decay[keep]


# family -> (attack s, base decay time s or 0 = sustained, ring factor, vibrato depth, breath noise)
ENVELOPES: dict[str, tuple[float, float, float, float, float]] = {
    "piano": (0.004, 0.45, 2.0, 0.0, 0.0),
    "guitar": (0.002, 0.25, 2.0, 0.0, 0.0),
    "strings": (0.12, 0.0, 1.0, 0.006, 0.0),
    "synth": (0.01, 0.0, 0.8, 0.0, 0.0),
    "organ": (0.005, 0.0, 1.0, 0.0, 0.0),
    "wind": (0.06, 0.0, 1.0, 0.004, 0.08),
    "brass": (0.05, 0.0, 0.95, 0.003, 0.0),
    "bass": (0.005, 0.6, 1.5, 0.0, 0.0),
    "vocal": (0.05, 0.0, 1.0, 0.015, 0.0),
}


def _render_note(family: str, f0: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """One note, [n] float64 samples."""
    attack, tau, _, vib, breath = ENVELOPES[family]
    t = np.arange(n) / SAMPLE_RATE  # [n]
    if vib > 0.0:
        rate = 5.5
        phase = 2 * np.pi * f0 * t - f0 * vib * np.cos(2 * np.pi * rate * t) / rate  # [n] integral of f(t)
    else:
        phase = 2 * np.pi * f0 * t  # [n]
    ratio, amp, decay = _partials(family, f0, rng)  # [H] each
    offsets = rng.uniform(0.0, 2 * np.pi, size=len(ratio))  # [H]
    out = np.zeros(n)
    for r, a, d, o in zip(ratio, amp, decay, offsets):
        part = np.sin(r * phase + o)
        if family == "brass":  # higher partials come in later: the brass "blat"
            part *= 1.0 - np.exp(-t / (0.02 * np.sqrt(r)))
        if tau > 0.0 and d > 0.0:
            part *= np.exp(-t * d / tau)
        out += a * part
    if breath > 0.0:
        hiss = np.convolve(rng.standard_normal(n), np.ones(16) / 4.0, mode="same")  # [n], box low-pass ~2.7 kHz
        out += breath * np.sum(amp) * hiss
    env = np.minimum(1.0, t / attack)  # [n] linear attack
    rel = min(n, int(0.03 * SAMPLE_RATE))
    env[n - rel :] *= np.linspace(1.0, 0.0, rel)  # 30-ms release, no clicks
    return out * env


def _place(buf: np.ndarray, note: np.ndarray, start: int) -> None:
    end = min(len(buf), start + len(note))
    buf[start:end] += note[: end - start]


def _peak_norm(x: np.ndarray, peak: float = 1.0) -> np.ndarray:
    m = float(np.max(np.abs(x)))
    return x * (peak / m) if m > 0 else x


def _drums(bpm: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Kick on beats 1 & 3, snare on 2 & 4, closed hat on every 8th. [n]"""
    out = np.zeros(n)
    beat = 60.0 / bpm
    tk = np.arange(int(0.25 * SAMPLE_RATE)) / SAMPLE_RATE
    kick = np.sin(2 * np.pi * (50 * tk + 100 * 0.03 * (1 - np.exp(-tk / 0.03)))) * np.exp(-tk / 0.12)
    ts = np.arange(int(0.2 * SAMPLE_RATE)) / SAMPLE_RATE
    th = np.arange(int(0.06 * SAMPLE_RATE)) / SAMPLE_RATE
    n_beats = int(n / SAMPLE_RATE / beat) + 1
    for b in range(n_beats):
        start = int(round(b * beat * SAMPLE_RATE))
        if b % 2 == 0:
            _place(out, kick, start)
        else:
            snare = (0.7 * rng.standard_normal(len(ts)) + 0.5 * np.sin(2 * np.pi * 185 * ts)) * np.exp(-ts / 0.07)
            _place(out, 0.8 * snare, start)
        for half in (0, 1):
            hat = np.diff(rng.standard_normal(len(th) + 1)) * np.exp(-th / 0.015)  # high-passed noise
            _place(out, 0.25 * hat, int(round((b + 0.5 * half) * beat * SAMPLE_RATE)))
    return out


def _lowpass(x: np.ndarray, cutoff_hz: float) -> np.ndarray:
    """Zero-phase FFT low-pass with a 500-Hz cosine taper."""
    spec = np.fft.rfft(x)  # [n//2+1]
    f = np.fft.rfftfreq(len(x), 1.0 / SAMPLE_RATE)
    gain = np.clip((cutoff_hz + 500.0 - f) / 500.0, 0.0, 1.0)
    gain = 0.5 - 0.5 * np.cos(np.pi * gain)
    return np.fft.irfft(spec * gain, n=len(x))


def render_clip(attrs: ClipAttributes, ytid: str, seed: int = 0, duration_s: float = DURATION_S) -> np.ndarray:
    """Render one clip. Returns [duration_s * SAMPLE_RATE] float64 in [-PEAK, PEAK]."""
    rng = np.random.default_rng(clip_seed(ytid, seed))
    n = int(round(duration_s * SAMPLE_RATE))
    steps, tonic = SCALES[attrs.mode]
    base = tonic + REGISTER_SHIFT[attrs.register] + (-24 if attrs.family == "bass" else 0)
    note_s = 60.0 / attrs.bpm / NOTES_PER_BEAT
    ring = ENVELOPES[attrs.family][2]

    # melody: bounded random walk over two octaves of scale degrees
    lead = np.zeros(n)
    n_notes = int(np.ceil(duration_s / note_s))
    degree = int(rng.integers(0, len(steps)))
    for i in range(n_notes):
        degree = int(np.clip(degree + rng.choice([-2, -1, -1, 0, 1, 1, 2]), 0, 2 * len(steps) - 1))
        midi = base + 12 * (degree // len(steps)) + steps[degree % len(steps)]
        start = int(round(i * note_s * SAMPLE_RATE))
        _place(lead, _render_note(attrs.family, _midi_hz(midi), int(ring * note_s * SAMPLE_RATE), rng), start)
    mix = _peak_norm(lead)

    if attrs.bass_line:  # tonic, tonic, fifth, fourth: one note per beat, two octaves down
        bass = np.zeros(n)
        beat = 60.0 / attrs.bpm
        pattern = (0, 0, 4 if len(steps) == 7 else 3, 3 if len(steps) == 7 else 2)
        for b in range(int(np.ceil(duration_s / beat))):
            midi = tonic - 24 + steps[pattern[b % 4]]
            note = _render_note("bass", _midi_hz(midi), int(1.2 * beat * SAMPLE_RATE), rng)
            _place(bass, note, int(round(b * beat * SAMPLE_RATE)))
        mix = mix + 0.6 * _peak_norm(bass)
    if attrs.drums:
        mix = mix + 0.7 * _peak_norm(_drums(attrs.bpm, n, rng))
    mix = _peak_norm(mix)
    if attrs.noise:  # lo-fi: band-limited, hissy, humming
        t = np.arange(n) / SAMPLE_RATE
        mix = _lowpass(mix, 3000.0)
        rms = float(np.sqrt(np.mean(mix**2)))
        mix = mix + 0.3 * rms * rng.standard_normal(n) + 0.1 * rms * np.sin(2 * np.pi * 60.0 * t)
    return _peak_norm(mix, PEAK)


def to_pcm16(x: np.ndarray) -> np.ndarray:
    """float in [-1, 1] -> int16, rounding (not truncating) so bytes are stable."""
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)

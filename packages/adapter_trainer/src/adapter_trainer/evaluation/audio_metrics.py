"""The audio metrics of decoded clips, as MusicGen's papers judge them: CLAP score, FAD on CLAP embeddings,
classifier KL (and the FAD of codec latents). Reads audio files and captions only, never codes or a codec;
docs/evaluation.md defines each figure and where it differs from audiocraft's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from adapter_trainer.evaluation.audio_inputs import (
    AUDIO_SUFFIXES,
    ENERGY_FLOOR,
    TARGET_LUFS,
    Audio,
    AudioMetricsError,
    Clip,
    list_audio,
    load_frame_embeddings,
    normalise_loudness,
    pair_clips,
    read_audio,
    read_captions,
    resample,
)
from adapter_trainer.evaluation.frechet import frechet_distance_of
from adapter_trainer.evaluation.stats import bootstrap_mean_ci, derangement

__all__ = ["AudioMetricsError", "Clip", "clap_scores", "kl_divergence"]

KL_EPSILON = 1e-6  # audiocraft's kl_divergence epsilon, added to the generated clip's probabilities
TOP_LABELS = 3  # classifier labels listed per clip
NORMALISE = ("loudness", "loudness-generated", "none")  # both sets / audiocraft's (generated only) / off


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of a [N, D] and b [N, D] -> [N]."""
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    return np.einsum("nd,nd->n", a, b) / np.maximum(na * nb, 1e-12)


def clap_scores(
    text_emb: np.ndarray,
    audio_emb: np.ndarray,
    n_derangements: int,
    seed: int,
    captions: list[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """text_emb [N, D], audio_emb [N, D] (row i: clip i) -> own-caption cosine [N], mean deranged cosine [N], and
    the derangements [R, N]. A draw of the clip's own caption text (captions, None: all distinct) is left out; a clip
    with no other-text draw gets the mean over every clip whose text differs."""
    own = cosine_rows(text_emb, audio_emb)  # [N]
    n = len(own)
    texts = np.asarray(captions if captions is not None else [str(i) for i in range(n)], dtype=object)  # [N]
    other = texts[:, None] != texts[None, :]  # [N, N] caption j's text differs from clip i's
    if not other.any(axis=1).all():
        raise AudioMetricsError(
            "every generated clip has the same caption text, so there is no other caption to score against "
            "(clap_score_deranged); generate from at least two different captions"
        )
    rng = np.random.default_rng(seed)
    perms = np.stack([derangement(n, rng) for _ in range(n_derangements)])  # [R, N], perms[r, i] != i
    cos = np.stack([cosine_rows(text_emb[p], audio_emb) for p in perms])  # [R, N]
    valid = other[np.arange(n)[None, :], perms]  # [R, N] the draw's caption text is not the clip's own
    n_valid = valid.sum(axis=0)  # [N]
    drawn = np.where(valid, cos, 0.0).sum(axis=0) / np.maximum(n_valid, 1)  # [N]
    a = audio_emb / np.maximum(np.linalg.norm(audio_emb, axis=1, keepdims=True), 1e-12)  # [N, D]
    t = text_emb / np.maximum(np.linalg.norm(text_emb, axis=1, keepdims=True), 1e-12)  # [N, D]
    all_cos = a @ t.T  # [N, N] clip i's audio vs caption j's text
    exact = np.where(other, all_cos, 0.0).sum(axis=1) / other.sum(axis=1)  # [N] mean over other-text captions
    deranged = np.where(n_valid > 0, drawn, exact)  # [N]
    return own, deranged, perms


def kl_divergence(p_ref: np.ndarray, p_gen: np.ndarray, eps: float = KL_EPSILON) -> np.ndarray:
    """audiocraft's kl_divergence(pred=gen, target=ref): sum_l p_ref log(p_ref / (p_gen + eps)) per row -> [N]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p_ref > 0, p_ref * (np.log(p_ref) - np.log(p_gen + eps)), 0.0)  # [N, L]
    return terms.sum(axis=1)


def _ci(values: np.ndarray, n_boot: int, seed: int) -> dict[str, float]:
    mean, lo, hi = bootstrap_mean_ci(values, n_boot, seed)
    return {"mean": mean, "lo": lo, "hi": hi, "level": 0.95}


def load_set(sources: dict[str, tuple[Path, tuple[float, float] | None]], normalise: bool) -> dict[str, Audio]:
    """{key: (file, window or None)} -> {key: Audio} read, checked and (normalise) loudness-normalised."""
    out = {}
    for key, (path, window) in sources.items():
        wave, sr = read_audio(path, window)
        out[key] = normalise_loudness(wave, sr, path) if normalise else Audio(wave, sr, None, None)
    return out


def at(audio: Audio, sample_rate: int, seconds: float | None = None) -> np.ndarray:
    """One clip at a model's rate [N'], cropped to `seconds` first when given."""
    wave = audio.wave if seconds is None else audio.wave[: int(round(seconds * audio.sample_rate))]
    return resample(wave, audio.sample_rate, sample_rate)


def kl_pairs(classifier: Any, clips: list[Clip], gen: dict[str, Audio], ref: dict[str, Audio]) -> dict[str, Any]:
    """Per generated clip its label distributions and, when paired, its partner's and their KL per segment pair
    (both cropped to the common length)."""
    sr = classifier.sample_rate
    paired = [c for c in clips if c.reference_key]
    common = {
        c.key: min(
            len(gen[c.key].wave) / gen[c.key].sample_rate,
            len(ref[c.reference_key].wave) / ref[c.reference_key].sample_rate,
        )
        for c in paired
    }
    gen_waves = [at(gen[c.key], sr, common.get(c.key)) for c in clips]  # [N_i] each
    ref_waves = [at(ref[c.reference_key], sr, common[c.key]) for c in paired]
    for i, c in enumerate(paired):  # the same number of samples on both sides: the same segments
        g = clips.index(c)
        n = min(len(gen_waves[g]), len(ref_waves[i]))
        gen_waves[g], ref_waves[i] = gen_waves[g][:n], ref_waves[i][:n]
    p_gen = classifier.segment_distributions(gen_waves)  # [S_i, L] per clip
    p_ref = dict(zip([c.key for c in paired], classifier.segment_distributions(ref_waves)))
    kl = {c.key: kl_divergence(p_ref[c.key], p_gen[clips.index(c)]) for c in paired}  # [S_i] per paired clip
    return {"p_gen": p_gen, "p_ref": p_ref, "kl": kl, "common_seconds": common}


def compute(args: argparse.Namespace) -> dict[str, Any]:
    """Load the models, embed and classify every clip, and return the report."""
    from adapter_trainer.evaluation.audio_models import (
        CLAP_TYPE,
        Clap,
        Classifier,
        check_classifier_config,
        check_model_type,
        clip_seed,
        resolve_device,
    )
    from adapter_trainer.evaluation.references import reference_sources

    generated = list_audio(Path(args.generated), "--generated")
    ref_sources, ref_kind = reference_sources(args)
    clips = pair_clips(generated, ref_sources, read_captions(Path(args.captions)), Path(args.captions))
    latents: dict[str, Any] = {}  # checked before any model loads
    if args.embeddings_generated:  # codec encoder latents, one embedding per frame
        g = load_frame_embeddings(Path(args.embeddings_generated), list(generated), "--embeddings-generated")
        r = load_frame_embeddings(Path(args.embeddings_reference), sorted(ref_sources), "--embeddings-reference")
        if g.shape[1] != r.shape[1]:
            raise AudioMetricsError(
                f"--embeddings-generated has D={g.shape[1]} but --embeddings-reference D={r.shape[1]}: use one codec"
            )
        latents = {
            "fad_codec_latents": frechet_distance_of(g, r),
            "codec_latent_frames": {"generated": len(g), "reference": len(r), "dim": g.shape[1]},
        }
    device = resolve_device(args.device)
    check_model_type(args.clap, "--clap", CLAP_TYPE, "a CLAP model")  # the models' configs before any audio
    check_classifier_config(args.classifier)
    gen = load_set({c.key: (c.wav, None) for c in clips}, args.normalise != "none")
    ref = load_set(ref_sources, args.normalise == "loudness")
    recon = (
        load_set(
            {k: (p, None) for k, p in list_audio(Path(args.reconstructed), "--reconstructed", AUDIO_SUFFIXES).items()},
            args.normalise == "loudness",
        )
        if args.reconstructed
        else {}
    )
    if recon and sorted(recon) != sorted(ref):
        raise AudioMetricsError(
            f"--reconstructed {args.reconstructed} holds other keys than the references ({len(set(recon) ^ set(ref))} "
            f"differ); decode the same clips the references are"
        )
    clap = Clap.load(args.clap, device)
    classifier = Classifier.load(args.classifier, device)

    # CLAP: texts and audio of the generated clips, audio of the references; each long clip's crop seeded by its key
    def embed(audio: dict[str, Audio]) -> np.ndarray:
        keys = list(audio)
        return clap.audio_embeddings(
            [at(audio[k], clap.sample_rate) for k in keys], [clip_seed(args.seed, k) for k in keys]
        )

    text_emb = clap.text_embeddings([c.caption for c in clips], max_tokens=args.text_max_tokens)  # [N, D]
    gen_audio, ref_audio = embed(gen), embed(ref)  # [N, D], [M, D]
    own, deranged, _ = clap_scores(  # [N], [N]
        text_emb, gen_audio, args.derangements, args.seed, captions=[c.caption for c in clips]
    )
    windows: dict[str, Any] = {}
    if args.fad_windows:
        gw = clap.window_embeddings([at(a, clap.sample_rate) for a in gen.values()])  # [Wg, D]
        rw = clap.window_embeddings([at(a, clap.sample_rate) for a in ref.values()])  # [Wr, D]
        windows = {
            "fad_clap_windows": frechet_distance_of(gw, rw),
            "clap_windows": {"generated": len(gw), "reference": len(rw)},
        }
    floor = {"fad_clap_clips_codec_floor": frechet_distance_of(embed(recon), ref_audio)} if recon else {}

    kl = kl_pairs(classifier, clips, gen, ref)
    seg_kl = np.concatenate(list(kl["kl"].values())) if kl["kl"] else np.zeros(0)  # [segment pairs]
    labels = classifier.labels

    def top(p: np.ndarray) -> list[dict[str, Any]]:
        return [{"label": labels[j], "p": float(p[j])} for j in np.argsort(-p)[:TOP_LABELS]]

    def loudness(a: Audio) -> dict[str, float | None]:
        return {"lufs_before": a.loudness_lufs, "gain_db": a.gain_db}

    return {
        "clap_score": float(own.mean()),
        "clap_score_ci": _ci(own, args.bootstrap, args.seed),
        "clap_score_deranged": float(deranged.mean()),
        "clap_score_minus_deranged": float((own - deranged).mean()),
        "clap_score_minus_deranged_ci": _ci(own - deranged, args.bootstrap, args.seed),
        "fad_clap_clips": frechet_distance_of(gen_audio, ref_audio),
        **windows,
        **floor,
        "kl_classifier": float(seg_kl.mean()) if seg_kl.size else None,
        **latents,
        "reference_kind": ref_kind,
        "n_generated": len(clips),
        "n_reference": len(ref),
        "n_kl_pairs": len(kl["kl"]),
        "n_kl_segment_pairs": int(seg_kl.size),
        "kl_unpaired": [c.key for c in clips if not c.reference_key],
        "n_derangements": args.derangements,
        "bootstrap_resamples": args.bootstrap,
        "seed": args.seed,
        "settings": settings(args, clap, classifier, gen, ref),
        "models": {
            "clap": args.clap,
            "clap_sample_rate": clap.sample_rate,
            "classifier": args.classifier,
            "classifier_sample_rate": classifier.sample_rate,
            "classifier_labels": len(labels),
            "classifier_segment_seconds": classifier.segment_seconds,
        },
        "definitions": DEFINITIONS,
        "per_clip": [
            {
                "key": c.key,
                "caption": c.caption,
                "reference_key": c.reference_key or None,
                "clap_score": float(own[i]),
                "clap_score_deranged": float(deranged[i]),
                "kl_classifier": float(kl["kl"][c.key].mean()) if c.reference_key else None,
                "kl_seconds": kl["common_seconds"].get(c.key),
                "top_labels": top(kl["p_gen"][i].mean(axis=0)),
                "reference_top_labels": top(kl["p_ref"][c.key].mean(axis=0)) if c.reference_key else None,
                "loudness": loudness(gen[c.key]),
            }
            for i, c in enumerate(clips)
        ],
    }


DEFINITIONS = {
    "clap_score": "mean cosine of CLAP text (own caption, <= text_max_tokens tokens) and audio embeddings over "
    "generated clips",
    "clap_score_deranged": "the same with other clips' captions (derangements, averaged)",
    "fad_clap_clips": "Frechet distance of Gaussians fitted to CLAP audio embeddings, one per clip, generated vs "
    "reference; NOT fadtk's clap-laion-* FAD (10-s windows every 1 s); biased upwards at small n: compare at equal "
    "n_generated/n_reference only",
    "fad_clap_windows": "the same over fadtk's windows (int16-quantised, CLAP-window windows every 1 s, the last ones "
    "zero-padded): fadtk's clap-laion-* embedding when the CLAP is that checkpoint",
    "fad_clap_clips_codec_floor": "fad_clap_clips of the codec's reconstructions against the original references",
    "kl_classifier": "mean over segment pairs of KL(p_ref || p_gen), p = softmax of the AudioSet classifier's "
    "logits, eps 1e-6 on p_gen, pairs cropped to their common length (audiocraft metrics/kld.py; AST, not PaSST)",
    "fad_codec_latents": "Frechet distance of codec encoder latents, one embedding per frame (the shards' codec; "
    "fadtk's encodec-emb is the 24 kHz EnCodec)",
}


def settings(args: argparse.Namespace, clap: Any, classifier: Any, gen: dict, ref: dict) -> dict[str, Any]:
    """Every evaluation choice that changes the numbers, and where audiocraft 1.3.0's MusicGen evaluation differs."""
    skipped = lambda s: sorted(k for k, a in s.items() if a.gain_db is None)
    applied = {"loudness": ["generated", "reference"], "loudness-generated": ["generated"], "none": []}[args.normalise]
    return {
        "normalisation": {
            "mode": args.normalise,
            "target_lufs": TARGET_LUFS if applied else None,
            "applied_to": applied,
            "energy_floor_rms": ENERGY_FLOOR,
            "clamped_to_unit": bool(applied),
            "left_unnormalised": {
                "generated": skipped(gen) if applied else [],
                "reference": skipped(ref) if "reference" in applied else [],
            },
            "audiocraft": "generated audio only, -14 LUFS (solvers/musicgen.py normalize_audio, strategy loudness); "
            "its FAD then peak-normalises both sets",
        },
        "text_max_tokens": clap.text_max_tokens(args.text_max_tokens),
        "text_max_tokens_audiocraft": 77,
        "clap_window_seconds": clap.window_samples / clap.sample_rate,
        "clap_long_clips": "one random crop of the window per clip, seeded by --seed and the clip's key",
        "fad_windows": {"window_seconds": clap.window_samples / clap.sample_rate, "hop_seconds": 1.0}
        if args.fad_windows
        else None,
        "segment_seconds": classifier.segment_seconds,
        "segment_seconds_audiocraft": 20.0,
        "classifier_short_segments": "zero-padded to segment_seconds by ASTFeatureExtractor (audiocraft's PaSST takes "
        "them unpadded; segments <= 0.15 s are dropped by both)",
        "kl_pairing": "each pair cropped to the shorter clip's length, KL per segment pair, mean over segment pairs",
        "differs_from_audiocraft": [
            "KL classifier AST (10.24-s window) instead of PaSST (20-s segments)",
            "FAD on CLAP embeddings instead of VGGish",
            "CLAP checkpoint from transformers (--clap) instead of music_audioset_epoch_15_esc_90.14.pt",
        ]
        + (["references loudness-normalised too"] if args.normalise == "loudness" else []),
    }


def check_writable(out: Path) -> None:
    """Fail before any model loads when --out cannot be written (nothing computed is lost to a bad path)."""
    probe = out.with_name(f".{out.name}.probe")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as e:
        raise AudioMetricsError(f"--out {out}: cannot write there ({e.strerror or e}); choose a writable path") from e

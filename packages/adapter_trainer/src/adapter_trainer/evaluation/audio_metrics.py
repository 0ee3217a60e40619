"""Judge decoded audio the way MusicGen's papers do: CLAP score, FAD on CLAP embeddings, classifier KL.

    python -m adapter_trainer.audio_metrics --generated RUN/listen/generated --reference RUN/listen/reference \
        --captions RUN/generated/captions.jsonl --clap laion/larger_clap_music \
        --classifier MIT/ast-finetuned-audioset-10-10-0.4593 --out RUN/audio_metrics.json

A step after `python -m tokenizer_pipeline.decode` (which writes `<key>.wav`): this process reads wav files and
captions only, never codes or a codec.

- `clap_score`: mean over generated clips of cos(CLAP text embedding of the clip's caption, CLAP audio embedding of
  the clip). `clap_score_deranged`: the same with other clips' captions (random derangements, averaged), the
  score a caption-blind generator would get on this set; `clap_score_minus_deranged` and its bootstrap interval
  (over clips) say whether the audio follows its own caption.
- `fad_clap`: Fréchet distance between Gaussians fitted to the CLAP audio embeddings of the generated and of the
  reference clips (evaluation.frechet; biased upwards at small n: compare only at equal n).
- `kl_classifier`: audiocraft's KL (metrics/kld.py): per pair, KL(p_ref || p_gen) = sum p_ref log(p_ref / (p_gen
  + 1e-6)) over AudioSet labels, with p = softmax of the classifier's logits; mean over pairs. A generated clip is
  paired with the reference clip whose key is its caption's `source_key` (adapter_trainer.generate writes it; it
  is the eval clip whose caption conditioned the clip), else the key after `gen-NNNN-`. Generated clips without
  a reference clip are listed in `kl_unpaired` and left out of the KL.
- `fad_encodec` (only with --embeddings-generated/--embeddings-reference): the Fréchet distance of EnCodec encoder
  latents, one embedding per frame (fadtk's `encodec-emb`), from `python -m tokenizer_pipeline.codec_embeddings`
  (the pipeline's process: this one never builds a codec).

Writes strict JSON (allow_nan=False; `null` where a value is undefined). Models load offline only (evaluation.audio_models).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adapter_trainer.errors import USER_ERROR_EXIT, UserError
from adapter_trainer.evaluation.frechet import frechet_distance_of
from adapter_trainer.evaluation.learning_check import bootstrap_mean_ci, derangement

KL_EPSILON = 1e-6  # audiocraft's kl_divergence epsilon, added to the generated clip's probabilities
GENERATED_KEY = re.compile(r"^gen-\d{4}-(.+)$")  # adapter_trainer.generate's keys: gen-NNNN-<source key>
TOP_LABELS = 3  # classifier labels listed per clip


class AudioMetricsError(UserError, ValueError):
    """Missing or inconsistent wavs / captions; the message names the file and the fix."""


@dataclass
class Clip:
    """A generated clip: its wav, the caption it was generated from, and its KL partner."""

    key: str
    wav: Path
    caption: str = ""
    reference_key: str = ""  # the reference clip it is paired with for the KL ("" = none)


def list_wavs(directory: Path, what: str) -> dict[str, Path]:
    """`<key>.wav` files of a directory, sorted by key."""
    if not directory.is_dir():
        raise AudioMetricsError(
            f"{what} {directory} is not a directory; decode the clips first (python -m tokenizer_pipeline.decode "
            f"<shard set> out_dir={directory})"
        )
    wavs = {p.stem: p for p in sorted(directory.glob("*.wav"))}
    if len(wavs) < 2:
        raise AudioMetricsError(f"{what} {directory} holds {len(wavs)} .wav file(s); the metrics need at least 2")
    return wavs


def read_captions(path: Path) -> dict[str, dict[str, str]]:
    """JSONL lines {"key", "caption"[, "source_key"]} -> {key: line}."""
    if not path.is_file():
        raise AudioMetricsError(
            f"--captions {path} does not exist; adapter_trainer.generate writes captions.jsonl in its out_dir "
            f"(one JSON line per clip: key, caption, source_key)"
        )
    out: dict[str, dict[str, str]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise AudioMetricsError(
                f'{path} line {n}: not JSON ({e.msg}); expected {{"key": ..., "caption": ...}}'
            ) from e
        if not isinstance(row, dict) or not isinstance(row.get("key"), str) or not isinstance(row.get("caption"), str):
            raise AudioMetricsError(f'{path} line {n}: needs string fields "key" and "caption", got {line[:120]!r}')
        if row["key"] in out:
            raise AudioMetricsError(f"{path} line {n}: key {row['key']!r} appears twice")
        out[row["key"]] = row
    return out


def source_key_of(key: str, row: dict[str, Any]) -> str:
    """The reference key a generated clip pairs with: its caption row's source_key, else the key's tail."""
    if row.get("source_key"):
        return str(row["source_key"])
    m = GENERATED_KEY.match(key)
    return m.group(1) if m else ""


def pair_clips(generated: dict[str, Path], reference: dict[str, Path], captions: dict[str, dict]) -> list[Clip]:
    """Generated wavs with their captions and KL partners. Every generated wav needs a caption."""
    missing = [k for k in generated if k not in captions]
    if missing:
        raise AudioMetricsError(
            f"{len(missing)} generated clip(s) have no caption line (first: {missing[:3]}); --captions must hold "
            f"one line per generated wav (the captions.jsonl of the generated set they were decoded from)"
        )
    clips = []
    for key, wav in generated.items():
        ref = source_key_of(key, captions[key])
        clips.append(
            Clip(key=key, wav=wav, caption=captions[key]["caption"], reference_key=ref if ref in reference else "")
        )
    return clips


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
    """Per clip: own-caption cosine [N], mean deranged cosine [N], and the derangements used [R, N].

    Several clips can share one caption text (generate.captions=file cycles its lines when generate.n exceeds
    them): a derangement's draw of another clip with the clip's own text is left out of that clip's mean, and a
    clip with no other-text draw gets the mean over every clip whose text differs.

    Args:
        text_emb: [N, D] embedding of clip i's caption in row i.
        audio_emb: [N, D] embedding of clip i's audio in row i.
        captions: clip i's caption text in item i (None: all distinct).
    """
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
    """audiocraft's kl_divergence(pred=gen, target=ref): sum_l p_ref log(p_ref / (p_gen + eps)) per row ->
    [N]; terms with p_ref = 0 are 0 (torch.nn.functional.kl_div's convention)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p_ref > 0, p_ref * (np.log(p_ref) - np.log(p_gen + eps)), 0.0)  # [N, L]
    return terms.sum(axis=1)


def _ci(values: np.ndarray, n_boot: int, seed: int) -> dict[str, float]:
    mean, lo, hi = bootstrap_mean_ci(values, n_boot, seed)
    return {"mean": mean, "lo": lo, "hi": hi, "level": 0.95}


def load_frame_embeddings(path: Path, wav_keys: list[str], what: str) -> np.ndarray:
    """A `tokenizer_pipeline.codec_embeddings` .npy -> [frames, D] float64; when its .json sidecar is there, its clip
    keys must be the wav keys of the directory it stands for (else the FAD would compare other clips)."""
    if not path.is_file():
        raise AudioMetricsError(
            f"{what} {path} does not exist; write it with python -m tokenizer_pipeline.codec_embeddings <wav dir> "
            f"--codec <codec dir> --out {path}"
        )
    emb = np.load(path, allow_pickle=False)
    if emb.ndim != 2 or emb.shape[0] < 2 or not np.issubdtype(emb.dtype, np.floating):
        raise AudioMetricsError(
            f"{what} {path}: expected float embeddings [frames >= 2, D], got {emb.dtype} {emb.shape}"
        )
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        keys = [c["key"] for c in json.loads(sidecar.read_text(encoding="utf-8"))["clips"]]
        if sorted(keys) != sorted(wav_keys):
            extra, missing = sorted(set(keys) - set(wav_keys)), sorted(set(wav_keys) - set(keys))
            raise AudioMetricsError(
                f"{what} {path} was computed from other clips than the wavs it is compared as ({sidecar}: "
                f"{len(extra)} keys not among the wavs, first {extra[:3]}; {len(missing)} wavs missing, first "
                f"{missing[:3]}); recompute it from the same directory"
            )
    return emb.astype(np.float64)  # [frames, D]


def compute(args: argparse.Namespace) -> dict[str, Any]:
    """Load the models, embed and classify every clip, and return the report (see the module docstring)."""
    from adapter_trainer.evaluation.audio_models import Clap, Classifier, read_mono, resolve_device

    generated = list_wavs(Path(args.generated), "--generated")
    reference = list_wavs(Path(args.reference), "--reference")
    clips = pair_clips(generated, reference, read_captions(Path(args.captions)))
    encodec: dict[str, Any] = {}  # checked before any model loads
    if args.embeddings_generated:  # EnCodec encoder latents, one embedding per frame (fadtk's encodec-emb)
        g = load_frame_embeddings(Path(args.embeddings_generated), list(generated), "--embeddings-generated")
        r = load_frame_embeddings(Path(args.embeddings_reference), sorted(reference), "--embeddings-reference")
        if g.shape[1] != r.shape[1]:
            raise AudioMetricsError(
                f"--embeddings-generated has D={g.shape[1]} but --embeddings-reference D={r.shape[1]}: use one codec"
            )
        encodec = {
            "fad_encodec": frechet_distance_of(g, r),
            "encodec_frames": {"generated": len(g), "reference": len(r), "dim": g.shape[1]},
        }
    device = resolve_device(args.device)
    clap = Clap.load(args.clap, device)
    classifier = Classifier.load(args.classifier, device)

    # CLAP: texts and audio of the generated clips, audio of the references
    gen_48 = [read_mono(c.wav, clap.sample_rate) for c in clips]  # [N_i] each
    ref_keys = list(reference)
    ref_48 = [read_mono(reference[k], clap.sample_rate) for k in ref_keys]
    text_emb = clap.text_embeddings([c.caption for c in clips])  # [N, D]
    gen_audio = clap.audio_embeddings(gen_48, seed=args.seed)  # [N, D]
    ref_audio = clap.audio_embeddings(ref_48, seed=args.seed)  # [M, D]
    own, deranged, _ = clap_scores(  # [N], [N]
        text_emb, gen_audio, args.derangements, args.seed, captions=[c.caption for c in clips]
    )
    fad = frechet_distance_of(gen_audio, ref_audio)

    # classifier: label distributions of every clip; KL over the generated clips that have a reference partner
    p_gen = classifier.label_distributions([read_mono(c.wav, classifier.sample_rate) for c in clips])  # [N, L]
    p_ref_all = classifier.label_distributions([read_mono(reference[k], classifier.sample_rate) for k in ref_keys])
    ref_row = {k: i for i, k in enumerate(ref_keys)}
    paired = [i for i, c in enumerate(clips) if c.reference_key]
    kl = np.full(len(clips), np.nan)  # [N], nan = unpaired
    if paired:
        p_ref = p_ref_all[[ref_row[clips[i].reference_key] for i in paired]]  # [P, L]
        kl[paired] = kl_divergence(p_ref, p_gen[paired])
    labels = classifier.labels

    def top(p: np.ndarray) -> list[dict[str, Any]]:
        return [{"label": labels[j], "p": float(p[j])} for j in np.argsort(-p)[:TOP_LABELS]]

    return {
        "clap_score": float(own.mean()),
        "clap_score_ci": _ci(own, args.bootstrap, args.seed),
        "clap_score_deranged": float(deranged.mean()),
        "clap_score_minus_deranged": float((own - deranged).mean()),
        "clap_score_minus_deranged_ci": _ci(own - deranged, args.bootstrap, args.seed),
        "fad_clap": fad,
        "kl_classifier": float(kl[paired].mean()) if paired else None,
        **encodec,
        "n_generated": len(clips),
        "n_reference": len(ref_keys),
        "n_kl_pairs": len(paired),
        "kl_unpaired": [c.key for c in clips if not c.reference_key],
        "n_derangements": args.derangements,
        "bootstrap_resamples": args.bootstrap,
        "seed": args.seed,
        "models": {
            "clap": args.clap,
            "clap_sample_rate": clap.sample_rate,
            "classifier": args.classifier,
            "classifier_sample_rate": classifier.sample_rate,
            "classifier_labels": len(labels),
            "classifier_segment_seconds": classifier.segment_seconds,
        },
        "definitions": {
            "clap_score": "mean cosine of CLAP text (own caption) and audio embeddings over generated clips",
            "clap_score_deranged": "the same with other clips' captions (derangements, averaged)",
            "fad_clap": "Frechet distance of Gaussians fitted to CLAP audio embeddings, generated vs reference; "
            "biased upwards at small n: compare at equal n_generated/n_reference only",
            "kl_classifier": "mean over pairs of KL(p_ref || p_gen), p = softmax of the AudioSet classifier's "
            "logits averaged over segments, eps 1e-6 on p_gen (audiocraft metrics/kld.py; AST instead of PaSST)",
        },
        "per_clip": [
            {
                "key": c.key,
                "caption": c.caption,
                "reference_key": c.reference_key or None,
                "clap_score": float(own[i]),
                "clap_score_deranged": float(deranged[i]),
                "kl_classifier": float(kl[i]) if c.reference_key else None,
                "top_labels": top(p_gen[i]),
                "reference_top_labels": top(p_ref_all[ref_row[c.reference_key]]) if c.reference_key else None,
            }
            for i, c in enumerate(clips)
        ],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from adapter_trainer.evaluation.audio_models import DEFAULT_CLAP, DEFAULT_CLASSIFIER

    p = argparse.ArgumentParser(
        prog="python -m adapter_trainer.audio_metrics",
        description="CLAP score, FAD (CLAP embeddings) and classifier KL of decoded generated clips vs references.",
    )
    p.add_argument("--generated", required=True, help="directory of generated <key>.wav (tokenizer_pipeline.decode)")
    p.add_argument("--reference", required=True, help="directory of reference <key>.wav")
    p.add_argument("--captions", required=True, help='JSONL {"key", "caption"[, "source_key"]} per generated clip')
    p.add_argument("--clap", default=DEFAULT_CLAP, help="ClapModel: hub id in the local cache, or a directory")
    p.add_argument("--classifier", default=DEFAULT_CLASSIFIER, help="ASTForAudioClassification: hub id or directory")
    p.add_argument("--out", required=True, help="report JSON to write")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--derangements", type=int, default=8, help="caption derangements averaged for the deranged score")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (over clips) for the intervals")
    p.add_argument("--seed", type=int, default=0, help="derangements, bootstrap and CLAP's random crops")
    p.add_argument("--embeddings-generated", help="tokenizer_pipeline.codec_embeddings .npy of --generated")
    p.add_argument("--embeddings-reference", help="the same for --reference; both given -> fad_encodec")
    p.add_argument(
        "--if-available",
        action="store_true",
        help="when a model is not available offline, print how to get it and exit 0 (for make listen)",
    )
    args = p.parse_args(argv)
    if args.derangements < 1 or args.bootstrap < 1:
        p.error("--derangements and --bootstrap must be >= 1")
    if bool(args.embeddings_generated) != bool(args.embeddings_reference):
        p.error("--embeddings-generated and --embeddings-reference go together")
    return args


def main(argv: list[str] | None = None) -> int:
    from adapter_trainer.evaluation.audio_models import how_to_get, is_available

    args = parse_args(argv)
    if args.if_available:
        absent = [m for m in (args.clap, args.classifier) if not is_available(m)]
        if absent:
            print(f"adapter_trainer.audio_metrics: skipped: {how_to_get(absent[0])}")
            return 0
    try:
        report = compute(args)
    except UserError as e:  # ModelUnavailableError included: one line, how to get the model
        print(f"adapter_trainer.audio_metrics: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(out)
    ci = report["clap_score_minus_deranged_ci"]
    kl = report["kl_classifier"]
    print(
        f"adapter_trainer.audio_metrics: {report['n_generated']} generated vs {report['n_reference']} reference clips: CLAP score "
        f"{report['clap_score']:.4f} (deranged captions {report['clap_score_deranged']:.4f}, difference "
        f"{ci['mean']:+.4f} [{ci['lo']:+.4f}, {ci['hi']:+.4f}]), FAD(CLAP) {report['fad_clap']:.4f}, KL "
        f"{'n/a (no pairs)' if kl is None else f'{kl:.4f}'} over {report['n_kl_pairs']} pairs -> {out}"
    )
    return 0

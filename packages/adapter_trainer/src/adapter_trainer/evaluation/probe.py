"""Does generation follow the caption? An attribute probe on codes (an offline analogue of MusicGen's classifier KL).

    python -m adapter_trainer.probe --shards build/demo/shards --generated RUN/generated --out RUN/generation_report.json

1. Labels: a few binary attributes read from a clip's aspect list (or its caption when it has none) by keyword:
   drums, fast-vs-slow, minor-vs-major, piano, guitar, vocal. "vs" attributes are undefined (skipped) when the
   text names neither side or both.
2. Features: per-clip code histograms of codebooks 0 and 1 (normalised per codebook, square-rooted, standardised
   with the train statistics), so clips of any length compare.
3. Probe: one L2-regularised logistic regression per attribute (torch, full batch, LBFGS), fitted on the TRAIN
   split's clips. (Hand-written here because adapter_trainer does not depend on scikit-learn; it is 20 lines.)
4. Scores, per generated clip, the fraction of its defined attributes the probe predicts correctly against
   (a) the attributes of its own caption, (b) those of deranged captions (other clips' captions, averaged over
   several derangements). `chance` is what predictions independent of the caption would score given the label and
   prediction rates; the probe's accuracy on the real eval clips (own captions) is the ceiling.

Writes generation_report.json: accuracy_true_captions, accuracy_deranged_captions, chance, bootstrap intervals
(over clips) for the true accuracy and for true - deranged, probe_ceiling_real_eval, per-attribute figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from adapter_trainer.data.shards import Clip, ShardFormatError, load_split, read_manifest
from adapter_trainer.errors import USER_ERROR_EXIT, UserError
from adapter_trainer.evaluation.learning_check import bootstrap_mean_ci, derangement

# attribute -> (positive words, negative words or None = "absence is negative"); whole words / phrases, lowercase
ATTRIBUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "drums": (
        (
            "drums",
            "drum",
            "drumming",
            "percussion",
            "percussive",
            "beat",
            "beats",
            "kick",
            "snare",
            "hi hat",
            "hi-hat",
            "cymbal",
            "cymbals",
            "tambourine",
            "claps",
            "drum machine",
            "bongo",
            "bongos",
        ),
        None,
    ),
    "fast": (
        (
            "fast",
            "upbeat",
            "uptempo",
            "up-tempo",
            "energetic",
            "dance",
            "danceable",
            "edm",
            "techno",
            "lively",
            "quick",
            "high tempo",
        ),
        ("slow", "mellow", "calm", "calming", "ballad", "relaxing", "relaxed", "lullaby", "soothing", "slow tempo"),
    ),
    "minor": (
        ("sad", "melancholic", "melancholy", "dark", "minor", "sinister", "eerie", "haunting", "emotional"),
        ("happy", "cheerful", "joyful", "uplifting", "bright", "major", "playful", "fun"),
    ),
    "piano": (("piano", "keyboard", "keyboards", "keys", "rhodes", "e-piano", "harpsichord"), None),
    "guitar": (
        ("guitar", "guitars", "e-guitar", "acoustic guitar", "electric guitar", "banjo", "ukulele", "mandolin"),
        None,
    ),
    "vocal": (("vocal", "vocals", "voice", "singer", "singing", "sings", "choir", "rapping", "rap"), None),
}
NAMES = tuple(ATTRIBUTES)
PROBE_BOOKS = (0, 1)  # codebooks whose histograms are the features


class ProbeInputError(UserError, ValueError):
    """The generated set cannot be probed (too few clips); the message says what to generate."""


def _has(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def attribute_labels(text: str) -> np.ndarray:
    """Text (aspects joined, or a caption) -> labels [A] float: 1, 0, or nan where the attribute is undefined."""
    t = text.lower()
    out = np.full(len(NAMES), np.nan)
    for a, (pos_words, neg_words) in enumerate(ATTRIBUTES.values()):
        pos = any(_has(t, w) for w in pos_words)
        if neg_words is None:
            out[a] = float(pos)
        else:
            neg = any(_has(t, w) for w in neg_words)
            if pos != neg:
                out[a] = float(pos)
    return out


def clip_text(clip: Clip) -> str:
    return ", ".join(clip.aspects) if clip.aspects else clip.caption


def code_features(codes: np.ndarray, codebook_size: int) -> np.ndarray:
    """codes [T, K] -> features [len(PROBE_BOOKS) * C]: sqrt of the per-codebook code frequencies."""
    hists = [
        np.bincount(codes[:, k].astype(np.int64), minlength=codebook_size) / max(1, codes.shape[0]) for k in PROBE_BOOKS
    ]
    return np.sqrt(np.concatenate(hists))  # [F]


@dataclass
class AttributeProbe:
    mean: np.ndarray  # [F] feature standardisation (train)
    std: np.ndarray  # [F]
    weight: torch.Tensor  # [F, A]
    bias: torch.Tensor  # [A]

    @classmethod
    def fit(cls, X: np.ndarray, Y: np.ndarray, l2: float = 1e-2, iters: int = 100) -> AttributeProbe:
        """X [N, F] features, Y [N, A] labels with nan = undefined (masked out of the loss)."""
        mean, std = X.mean(0), X.std(0) + 1e-6
        x = torch.from_numpy((X - mean) / std).float()  # [N, F]
        y = torch.from_numpy(np.nan_to_num(Y)).float()  # [N, A]
        m = torch.from_numpy(~np.isnan(Y)).float()  # [N, A]
        w = torch.zeros(x.shape[1], y.shape[1], requires_grad=True)  # [F, A]
        b = torch.zeros(y.shape[1], requires_grad=True)  # [A]
        opt = torch.optim.LBFGS([w, b], max_iter=iters, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            bce = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y, reduction="none")  # [N, A]
            loss = (bce * m).sum(0).div(m.sum(0).clamp(min=1)).sum() + l2 * (w * w).sum()
            loss.backward()
            return loss

        opt.step(closure)
        return cls(mean=mean, std=std, weight=w.detach(), bias=b.detach())

    def predict(self, X: np.ndarray) -> np.ndarray:
        """X [N, F] -> 0/1 predictions [N, A]."""
        x = torch.from_numpy((X - self.mean) / self.std).float()  # [N, F]
        return ((x @ self.weight + self.bias) > 0).float().numpy()


def per_clip_accuracy(pred: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """pred [N, A], labels [N, A] (nan = undefined) -> [N] fraction correct over defined attributes (nan if none)."""
    defined = ~np.isnan(labels)
    correct = (pred == np.nan_to_num(labels)) & defined
    n = defined.sum(1)
    return np.where(n > 0, correct.sum(1) / np.maximum(n, 1), np.nan)


def chance_accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of predictions independent of the labels with the same rates: sum_a w_a (q_a p_a + (1-q_a)(1-p_a))."""
    total, weight = 0.0, 0
    for a in range(labels.shape[1]):
        d = ~np.isnan(labels[:, a])
        if not d.any():
            continue
        p, q = labels[d, a].mean(), pred[:, a].mean()
        total += d.sum() * (q * p + (1 - q) * (1 - p))
        weight += d.sum()
    return float(total / max(weight, 1))


def make_report(
    train: list[Clip],
    real_eval: list[Clip],
    generated: list[Clip],
    codebook_size: int,
    *,
    derangements: int = 8,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> dict:
    """Fit on `train`, score `generated` (true vs deranged captions) and `real_eval` (the ceiling)."""
    if len(generated) < 2:
        raise ProbeInputError(
            f"the probe report needs >= 2 generated clips (got {len(generated)}) for derangements; generate more "
            f"(generate.n)"
        )
    feats = lambda clips: np.stack([code_features(c.codes, codebook_size) for c in clips])
    labels = lambda clips: np.stack([attribute_labels(clip_text(c)) for c in clips])
    probe = AttributeProbe.fit(feats(train), labels(train))
    Xg, Yg = feats(generated), labels(generated)
    pred = probe.predict(Xg)  # [N, A]
    acc_true = per_clip_accuracy(pred, Yg)  # [N]
    rng = np.random.default_rng(seed)
    acc_der = np.nanmean(
        np.stack([per_clip_accuracy(pred, Yg[derangement(len(generated), rng)]) for _ in range(derangements)]), axis=0
    )  # [N]
    ok = ~np.isnan(acc_true) & ~np.isnan(acc_der)
    mean_true, lo_true, hi_true = bootstrap_mean_ci(acc_true[ok], n_bootstrap, seed)
    diff, lo_diff, hi_diff = bootstrap_mean_ci(acc_true[ok] - acc_der[ok], n_bootstrap, seed + 1)
    Ye = labels(real_eval)
    pred_e = probe.predict(feats(real_eval))
    acc_e = per_clip_accuracy(pred_e, Ye)
    per_attr = {}
    for a, name in enumerate(NAMES):
        d = ~np.isnan(Yg[:, a])
        de = ~np.isnan(Ye[:, a])
        per_attr[name] = {
            "n_generated_labelled": int(d.sum()),
            "accuracy_generated": float((pred[d, a] == Yg[d, a]).mean()) if d.any() else None,
            "accuracy_real_eval": float((pred_e[de, a] == Ye[de, a]).mean()) if de.any() else None,
            "positive_rate_train": float(np.nanmean(labels(train)[:, a]))
            if (~np.isnan(labels(train)[:, a])).any()
            else None,
        }
    return {
        "n_generated": len(generated),
        "n_scored": int(ok.sum()),
        "n_train": len(train),
        "n_real_eval": len(real_eval),
        "attributes": list(NAMES),
        "accuracy_true_captions": mean_true,
        "accuracy_true_captions_ci95": [lo_true, hi_true],
        "accuracy_deranged_captions": float(acc_der[ok].mean()),
        "true_minus_deranged": diff,
        "true_minus_deranged_ci95": [lo_diff, hi_diff],
        "chance": chance_accuracy(pred, Yg),
        "probe_ceiling_real_eval": float(np.nanmean(acc_e)),
        "probe_chance_real_eval": chance_accuracy(pred_e, Ye),
        "derangements": derangements,
        "bootstrap": n_bootstrap,
        "per_attribute": per_attr,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapter_trainer.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True, type=Path, help="the training shard set (train + eval splits)")
    ap.add_argument("--generated", required=True, type=Path, help="a set written by adapter_trainer.generate")
    ap.add_argument("--out", required=True, type=Path, help="generation_report.json to write")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--eval-split", default="eval")
    ap.add_argument("--derangements", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        report = _probe(args)
    except UserError as e:  # ShardFormatError: a set that breaks the contract or mixes codecs
        print(f"adapter_trainer.probe: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(
        f"probe: accuracy true captions {report['accuracy_true_captions']:.3f} "
        f"[{report['accuracy_true_captions_ci95'][0]:.3f}, {report['accuracy_true_captions_ci95'][1]:.3f}], "
        f"deranged {report['accuracy_deranged_captions']:.3f}, chance {report['chance']:.3f}, "
        f"true - deranged {report['true_minus_deranged']:+.3f} [{report['true_minus_deranged_ci95'][0]:+.3f}, "
        f"{report['true_minus_deranged_ci95'][1]:+.3f}]; probe ceiling on real eval clips "
        f"{report['probe_ceiling_real_eval']:.3f} (chance {report['probe_chance_real_eval']:.3f}) -> {args.out}"
    )
    return 0


def _probe(args: argparse.Namespace) -> dict:
    """Read both sets, score, write the report JSON; returns it."""
    real, gen = read_manifest(args.shards), read_manifest(args.generated)
    if (real.n_codebooks, real.codebook_size) != (gen.n_codebooks, gen.codebook_size):
        raise ShardFormatError(
            f"{args.generated} has K x C = {gen.n_codebooks} x {gen.codebook_size}, {args.shards} "
            f"{real.n_codebooks} x {real.codebook_size}: the probe needs codes of the same codec"
        )
    report = make_report(
        load_split([real], args.train_split),
        load_split([real], args.eval_split),
        load_split([gen], "generated"),
        real.codebook_size,
        derangements=args.derangements,
        n_bootstrap=args.bootstrap,
        seed=args.seed,
    )
    report["shards"], report["generated"] = str(args.shards), str(args.generated)
    args.out.write_text(json.dumps(_finite_or_none(report), indent=2, allow_nan=False) + "\n")
    return report


def _finite_or_none(x: object) -> object:
    """NaN/inf -> None recursively (an accuracy over no defined attribute is NaN): the report is strict JSON.
    The same rule as training.metric_logging.finite_or_none, which this room may not import."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x


if __name__ == "__main__":
    raise SystemExit(main())

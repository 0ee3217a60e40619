"""The attribute probe: does generation follow the caption? (an offline analogue of MusicGen's classifier KL).

Keyword attributes of each caption (drums, fast, minor, piano, guitar, vocal), one logistic regression per attribute
on code histograms of codebooks 0 and 1 fitted on the train split, and each generated clip's accuracy against its
own caption vs deranged captions (the null), with the real eval clips as the ceiling (docs/architecture.md,
"Listening").
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from adapter_trainer.data.samples import Clip, load_split
from adapter_trainer.data.shards import ShardFormatError, read_manifest
from adapter_trainer.errors import UserError
from adapter_trainer.evaluation.stats import bootstrap_mean_ci, derangement


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(","))


# attribute -> (positive words, negative words or None = "absence is negative"); whole words / phrases, lowercase
ATTRIBUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "drums": (
        _words(
            "drums, drum, drumming, percussion, percussive, beat, beats, kick, snare, hi hat, hi-hat, cymbal, "
            "cymbals, tambourine, claps, drum machine, bongo, bongos"
        ),
        None,
    ),
    "fast": (
        _words("fast, upbeat, uptempo, up-tempo, energetic, dance, danceable, edm, techno, lively, quick, high tempo"),
        _words("slow, mellow, calm, calming, ballad, relaxing, relaxed, lullaby, soothing, slow tempo"),
    ),
    "minor": (
        _words("sad, melancholic, melancholy, dark, minor, sinister, eerie, haunting, emotional"),
        _words("happy, cheerful, joyful, uplifting, bright, major, playful, fun"),
    ),
    "piano": (_words("piano, keyboard, keyboards, keys, rhodes, e-piano, harpsichord"), None),
    "guitar": (_words("guitar, guitars, e-guitar, acoustic guitar, electric guitar, banjo, ukulele, mandolin"), None),
    "vocal": (_words("vocal, vocals, voice, singer, singing, sings, choir, rapping, rap"), None),
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


FOLLOWS = "follows its captions"
NOT_DETECTED = "not detected at this clip count"
TOO_FEW = "too few clips"
# below this many scored clips the percentile bootstrap's interval is too narrow to give a verdict (docs/results.md)
MIN_VERDICT_CLIPS = 30
# z_(1 - alpha/2) + z_(power) for alpha = 0.05 two-sided and 80% power: 1.960 + 0.842
MDE_Z = 2.8
MDE_METHOD = (
    "2.8 x the standard error of the per-clip true - deranged (normal approximation: 80% power, alpha 0.05 two-sided)"
)


def verdict(ci95: tuple[float, float] | list[float], n_clips: int) -> str:
    """FOLLOWS when the 95% interval of true - deranged is above 0 over >= MIN_VERDICT_CLIPS clips (TOO_FEW below),
    else NOT_DETECTED: absence of evidence at this clip count, never evidence of ignoring the caption."""
    if n_clips < MIN_VERDICT_CLIPS:
        return TOO_FEW
    return FOLLOWS if ci95[0] > 0 else NOT_DETECTED


def minimum_detectable_effect(diffs: np.ndarray, z: float = MDE_Z) -> float:
    """diffs [N] per-clip true - deranged -> z * sd / sqrt(N): the smallest mean effect this many clips detect (MDE_METHOD)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return float("nan")
    return float(z * d.std(ddof=1) / np.sqrt(d.size))


def fraction_of_ceiling(
    gen_diffs: np.ndarray, real_diffs: np.ndarray, n_bootstrap: int, seed: int, level: float = 0.95
) -> tuple[float, float, float]:
    """mean(gen_diffs [N]) / mean(real_diffs [M]) (true - deranged per clip) with a percentile bootstrap resampling
    both sets. NaN when the denominator's own interval is not above 0: a ratio over a denominator near 0 is unbounded."""
    g, r = np.asarray(gen_diffs, dtype=np.float64), np.asarray(real_diffs, dtype=np.float64)
    if g.size == 0 or r.size == 0 or r.mean() <= 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    num = g[rng.integers(0, g.size, size=(n_bootstrap, g.size))].mean(axis=1)  # [R]
    den = r[rng.integers(0, r.size, size=(n_bootstrap, r.size))].mean(axis=1)  # [R]
    if np.quantile(den, (1.0 - level) / 2.0) <= 0:
        return float("nan"), float("nan"), float("nan")
    ratios = num[den > 0] / den[den > 0]
    if ratios.size == 0:
        return float(g.mean() / r.mean()), float("nan"), float("nan")
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [a, 1.0 - a])
    return float(g.mean() / r.mean()), float(lo), float(hi)


def _deranged_accuracy(
    pred: np.ndarray,
    labels: np.ndarray,
    derangements: int,
    rng: np.random.Generator,
    texts: list[str] | None = None,
) -> np.ndarray:
    """pred [N, A], labels [N, A] -> [N] each clip's accuracy against other clips' labels, averaged over derangements.
    A draw of the clip's own caption text (texts, None: all distinct) is left out; a clip with no other-text draw gets
    the mean over every clip whose text differs."""
    n = len(labels)
    t = np.asarray(texts if texts is not None else [str(i) for i in range(n)], dtype=object)  # [N]
    perms = [derangement(n, rng) for _ in range(derangements)]
    scores = [np.where(t[p] != t, per_clip_accuracy(pred, labels[p]), np.nan) for p in perms]  # R x [N]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan columns: filled below
        out = np.nanmean(np.stack(scores), axis=0)  # [N]; nan where no deranged caption defined an attribute
    for i in np.flatnonzero(np.isnan(out)):
        others = np.flatnonzero(t != t[i])  # [M] clips of another text
        if others.size:
            acc = per_clip_accuracy(np.broadcast_to(pred[i], labels[others].shape), labels[others])  # [M]
            out[i] = np.nanmean(acc) if not np.isnan(acc).all() else np.nan
    return out


def _attribute_dict(row: np.ndarray) -> dict[str, int | None]:
    """labels or predictions [A] -> {attribute: 1 | 0 | None (undefined)}."""
    return {name: (None if np.isnan(v) else int(v)) for name, v in zip(NAMES, row)}


def make_report(
    train: list[Clip],
    real_eval: list[Clip],
    generated: list[Clip],
    codebook_size: int,
    *,
    derangements: int = 8,
    n_bootstrap: int = 1000,
    seed: int = 0,
    source_keys: list[str] | None = None,
) -> dict:
    """Fit on `train`, score `generated` (true vs deranged captions) and `real_eval` (the ceiling and its null); the
    ceiling is over the eval clips whose captions generated the set (`source_keys`) when there are >= 2."""
    subset = sorted(set(source_keys or []) & {c.key for c in real_eval})
    if len(subset) >= 2:
        real_eval = [c for c in real_eval if c.key in set(subset)]
    if len(generated) < 2 or len(real_eval) < 2:
        raise ProbeInputError(
            f"the probe report needs >= 2 generated clips (got {len(generated)}) and >= 2 real eval clips (got "
            f"{len(real_eval)}) for derangements; generate more (generate.n=0 = every eval caption)"
        )
    feats = lambda clips: np.stack([code_features(c.codes, codebook_size) for c in clips])  # [N, F]
    labels = lambda clips: np.stack([attribute_labels(clip_text(c)) for c in clips])  # [N, A]
    Yt = labels(train)
    probe = AttributeProbe.fit(feats(train), Yt)
    rng = np.random.default_rng(seed)

    Yg = labels(generated)
    pred = probe.predict(feats(generated))  # [N, A]
    acc_true = per_clip_accuracy(pred, Yg)  # [N]
    acc_der = _deranged_accuracy(pred, Yg, derangements, rng, texts=[clip_text(c) for c in generated])  # [N]
    ok = ~np.isnan(acc_true) & ~np.isnan(acc_der)
    diffs = acc_true[ok] - acc_der[ok]  # [n_clips]
    mean_true, lo_true, hi_true = bootstrap_mean_ci(acc_true[ok], n_bootstrap, seed)
    diff, lo_diff, hi_diff = bootstrap_mean_ci(diffs, n_bootstrap, seed + 1)

    Ye = labels(real_eval)
    pred_e = probe.predict(feats(real_eval))  # [M, A]
    acc_e = per_clip_accuracy(pred_e, Ye)  # [M]
    # its own stream: the real clips' null must not depend on how many clips were generated
    acc_e_der = _deranged_accuracy(
        pred_e, Ye, derangements, np.random.default_rng(seed + 3), texts=[clip_text(c) for c in real_eval]
    )  # [M]
    ok_e = ~np.isnan(acc_e) & ~np.isnan(acc_e_der)
    frac, lo_frac, hi_frac = fraction_of_ceiling(diffs, acc_e[ok_e] - acc_e_der[ok_e], n_bootstrap, seed + 2)
    gap = float(acc_e[ok_e].mean() - acc_e_der[ok_e].mean())
    mde = minimum_detectable_effect(diffs)

    per_attr = {}
    for a, name in enumerate(NAMES):
        d, de, dt = ~np.isnan(Yg[:, a]), ~np.isnan(Ye[:, a]), ~np.isnan(Yt[:, a])
        per_attr[name] = {
            "n_generated_labelled": int(d.sum()),
            "accuracy_generated": float((pred[d, a] == Yg[d, a]).mean()) if d.any() else None,
            "accuracy_real_eval": float((pred_e[de, a] == Ye[de, a]).mean()) if de.any() else None,
            "positive_rate_train": float(Yt[dt, a].mean()) if dt.any() else None,
        }
    per_clip = [
        {
            "key": c.key,
            "caption_attributes": _attribute_dict(Yg[i]),
            "predicted_attributes": _attribute_dict(pred[i]),
            "accuracy_true": float(acc_true[i]),  # nan (-> null) when the caption defines no attribute
            "accuracy_deranged": float(acc_der[i]),
        }
        for i, c in enumerate(generated)
    ]
    return {
        "n_generated": len(generated),
        "n_clips": int(ok.sum()),  # generated clips scored (their caption defines at least one attribute)
        "n_scored": int(ok.sum()),
        "n_train": len(train),
        "n_real_eval": len(real_eval),
        "ceiling_clips": "the eval clips whose captions generated the set" if len(subset) >= 2 else "every eval clip",
        "attributes": list(NAMES),
        "accuracy_true_captions": mean_true,
        "accuracy_true_captions_ci95": [lo_true, hi_true],
        "accuracy_deranged_captions": float(acc_der[ok].mean()),
        "true_minus_deranged": diff,
        "true_minus_deranged_ci95": [lo_diff, hi_diff],
        "verdict": verdict((lo_diff, hi_diff), int(ok.sum())),
        "min_verdict_clips": MIN_VERDICT_CLIPS,
        "probe_ceiling_real_eval": float(acc_e[ok_e].mean()),
        "probe_deranged_real_eval": float(acc_e_der[ok_e].mean()),
        "fraction_of_ceiling": frac,
        "fraction_of_ceiling_ci95": [lo_frac, hi_frac],
        "mde": mde,
        "mde_fraction_of_ceiling": mde / gap if gap > 0 and np.isfinite(frac) else float("nan"),
        "mde_method": MDE_METHOD,
        "derangements": derangements,
        "bootstrap": n_bootstrap,
        "per_attribute": per_attr,
        "per_clip": per_clip,
    }


def run_probe(args: argparse.Namespace) -> dict:
    """Read both sets (the options of `python -m adapter_trainer.probe`), score, write the report JSON; returns it."""
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
        source_keys=_source_keys(gen.manifest_path),
    )
    report["shards"], report["generated"] = str(args.shards), str(args.generated)
    report["sampling"] = _generated_settings(gen.manifest_path)
    args.out.write_text(json.dumps(_finite_or_none(report), indent=2, allow_nan=False) + "\n")
    return report


def _source_keys(manifest_path: Path) -> list[str]:
    """The eval clips whose captions generated the set (generated.captions[].source_key; "" ones left out)."""
    gen = json.loads(manifest_path.read_text(encoding="utf-8")).get("generated") or {}
    return [c["source_key"] for c in gen.get("captions") or [] if isinstance(c, dict) and c.get("source_key")]


def _generated_settings(manifest_path: Path) -> dict:
    """What was measured: the generated set's checkpoint step and sampling settings (absent keys -> None)."""
    gen = json.loads(manifest_path.read_text(encoding="utf-8")).get("generated") or {}
    s = gen.get("sampling") or {}
    keys = ("seconds", "cfg_scale", "top_k", "top_p", "temperature", "seed")
    return {"checkpoint_step": gen.get("checkpoint_step"), **{k: s.get(k) for k in keys}}


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None or not np.isfinite(x) else format(x, spec)


def summary_lines(report: dict) -> list[str]:
    """The report in four lines of text (what `python -m adapter_trainer.probe` prints)."""
    r, s = report, report.get("sampling") or {}
    ci = lambda key, spec: f"[{_fmt(r[key][0], spec)}, {_fmt(r[key][1], spec)}]"
    measured = f"{r['n_clips']} generated clips scored"
    if s:
        measured += (
            f" ({s.get('seconds')} s, CFG {s.get('cfg_scale')}, top-k {s.get('top_k')}, seed {s.get('seed')}, "
            f"checkpoint step {s.get('checkpoint_step')})"
        )
    return [
        f"{measured}: accuracy with own captions {_fmt(r['accuracy_true_captions'], '.3f')} "
        f"{ci('accuracy_true_captions_ci95', '.3f')}, with deranged captions (the null) "
        f"{_fmt(r['accuracy_deranged_captions'], '.3f')}; true - deranged {_fmt(r['true_minus_deranged'], '+.3f')} "
        f"{ci('true_minus_deranged_ci95', '+.3f')} (95% bootstrap over clips)",
        f"real eval clips: own captions {_fmt(r['probe_ceiling_real_eval'], '.3f')} (the ceiling), deranged "
        f"{_fmt(r['probe_deranged_real_eval'], '.3f')}; fraction of the ceiling reached "
        f"{_fmt(r['fraction_of_ceiling'], '.2f')} {ci('fraction_of_ceiling_ci95', '.2f')}",
        f"minimum detectable effect at {r['n_clips']} clips: {_fmt(r['mde'], '.3f')} "
        f"({_fmt(r['mde_fraction_of_ceiling'], '.2f')} of the ceiling; {MDE_METHOD})",
        f"verdict: {r['verdict']} "
        + (
            "(the interval of true - deranged is above 0)"
            if r["verdict"] == FOLLOWS
            else f"(a verdict needs >= {MIN_VERDICT_CLIPS} scored clips)"
            if r["verdict"] == TOO_FEW
            else "(that interval is not above 0)"
        ),
    ]


def _finite_or_none(x: object) -> object:
    """NaN/inf -> None recursively: the report is strict JSON (training.metric_logging's rule; not importable here)."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x

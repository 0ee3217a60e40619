"""How much of the attribute probe's reach generation follows: the fraction of the probe ceiling.

    python benchmarks/probe_fraction.py --shards build/demo/shards --generated RUN/generated [RUN2/generated ...]

For each generated set (adapter_trainer.generate with generate.captions=eval), with the probe of
adapter_trainer.evaluation.probe fitted on the train split exactly as `python -m adapter_trainer.probe` fits it:
    true      accuracy of the generated clips against their own captions' attributes
    deranged  the same against deranged captions (8 derangements, averaged)
    ceiling   accuracy of the real eval clips against their own captions
    real_der  accuracy of the real eval clips against deranged captions (what a clip that ignored its caption but
              sounded real would score)
    fraction  (true - deranged) / (ceiling - real_der): 1 = generation follows captions as well as real clips do.
The true - deranged interval is a bootstrap over generated clips. Prints one JSON line per set. A measurement script,
not part of the probe module (whose report does not score real clips against deranged captions).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from adapter_trainer.data.shards import load_split, read_manifest
from adapter_trainer.evaluation.learning_check import bootstrap_mean_ci, derangement
from adapter_trainer.evaluation.probe import (
    AttributeProbe,
    attribute_labels,
    clip_text,
    code_features,
    per_clip_accuracy,
)


def deranged_accuracy(pred: np.ndarray, labels: np.ndarray, n: int, seed: int) -> np.ndarray:
    """[N] per-clip accuracy of pred [N, A] against deranged labels [N, A], averaged over n derangements."""
    rng = np.random.default_rng(seed)
    return np.nanmean(
        np.stack([per_clip_accuracy(pred, labels[derangement(len(labels), rng)]) for _ in range(n)]), axis=0
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=Path, required=True)
    ap.add_argument("--generated", type=Path, nargs="+", required=True)
    ap.add_argument("--derangements", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    args = ap.parse_args()
    real = read_manifest(args.shards)
    train, real_eval = load_split([real], "train"), load_split([real], "eval")
    C = real.codebook_size
    feats = lambda clips: np.stack([code_features(c.codes, C) for c in clips])  # [N, F]
    labels = lambda clips: np.stack([attribute_labels(clip_text(c)) for c in clips])  # [N, A]
    probe = AttributeProbe.fit(feats(train), labels(train))
    pred_e, Ye = probe.predict(feats(real_eval)), labels(real_eval)
    ceiling = float(np.nanmean(per_clip_accuracy(pred_e, Ye)))
    real_der = float(np.nanmean(deranged_accuracy(pred_e, Ye, args.derangements, 0)))
    for gen_dir in args.generated:
        gen = load_split([read_manifest(gen_dir)], "generated")
        pred, Yg = probe.predict(feats(gen)), labels(gen)
        acc_true = per_clip_accuracy(pred, Yg)  # [N]
        acc_der = deranged_accuracy(pred, Yg, args.derangements, 0)  # [N]
        ok = ~np.isnan(acc_true) & ~np.isnan(acc_der)
        diff, lo, hi = bootstrap_mean_ci(acc_true[ok] - acc_der[ok], args.bootstrap, 1)
        row = {
            "generated": str(gen_dir),
            "n": int(ok.sum()),
            "true": float(acc_true[ok].mean()),
            "deranged": float(acc_der[ok].mean()),
            "true_minus_deranged": diff,
            "ci95": [lo, hi],
            "ceiling": ceiling,
            "real_deranged": real_der,
            "fraction_of_ceiling": diff / (ceiling - real_der),
        }
        print(json.dumps(row, allow_nan=False))


if __name__ == "__main__":
    main()

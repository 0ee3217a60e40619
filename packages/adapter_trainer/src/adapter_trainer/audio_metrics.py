"""`python -m adapter_trainer.audio_metrics`: CLAP score, FAD and classifier KL of decoded clips (docs/evaluation.md).

    python -m adapter_trainer.audio_metrics --generated RUN/listen/generated --reference RUN/listen/reference \\
        --captions RUN/generated/captions.jsonl --out RUN/audio_metrics.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adapter_trainer.errors import USER_ERROR_EXIT, UserError
from adapter_trainer.evaluation.audio_metrics import NORMALISE, check_writable, compute


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from adapter_trainer.evaluation.audio_models import CLAP_TEXT_MAX_TOKENS, DEFAULT_CLAP, DEFAULT_CLASSIFIER

    p = argparse.ArgumentParser(
        prog="python -m adapter_trainer.audio_metrics",
        description="CLAP score, FAD (CLAP embeddings) and classifier KL of decoded generated clips vs references.",
    )
    p.add_argument("--generated", required=True, help="directory of generated <key>.wav (tokenizer_pipeline.decode)")
    p.add_argument("--reference", help="directory of reference <key>.wav|flac|ogg (decoded from shards, or originals)")
    p.add_argument(
        "--reference-kind",
        choices=("codec-reconstruction", "original"),
        default="codec-reconstruction",
        help="what --reference holds (make listen: codec reconstructions decoded from the eval shards)",
    )
    p.add_argument("--reference-shards", help="own-audio shard set: references read from each sample's source window")
    p.add_argument("--reference-split", default="eval", help="the split of --reference-shards to read")
    p.add_argument("--audio-root", help="directory the shard samples' source_file paths are relative to")
    p.add_argument("--reconstructed", help="the references' codec reconstructions -> fad_clap_clips_codec_floor")
    p.add_argument("--captions", required=True, help='JSONL {"key", "caption"[, "source_key"]} per generated clip')
    p.add_argument("--clap", default=DEFAULT_CLAP, help="ClapModel: hub id in the local cache, or a directory")
    p.add_argument("--classifier", default=DEFAULT_CLASSIFIER, help="ASTForAudioClassification: hub id or directory")
    p.add_argument("--out", required=True, help="report JSON to write")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--normalise", choices=NORMALISE, default="loudness", help="loudness-normalise to -14 LUFS first")
    p.add_argument("--text-max-tokens", type=int, default=CLAP_TEXT_MAX_TOKENS, help="CLAP caption tokens kept")
    p.add_argument("--fad-windows", action="store_true", help="also fad_clap_windows (fadtk's windows; ~10x CLAP)")
    p.add_argument("--derangements", type=int, default=8, help="caption derangements averaged for the deranged score")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (over clips) for the intervals")
    p.add_argument("--seed", type=int, default=0, help="derangements, bootstrap and CLAP's random crops (>= 0)")
    p.add_argument("--embeddings-generated", help="tokenizer_pipeline.codec_embeddings .npy of --generated")
    p.add_argument("--embeddings-reference", help="the same for --reference; both given -> fad_codec_latents")
    p.add_argument(
        "--if-available",
        action="store_true",
        help="when a model is not available offline, print how to get it and exit 0 (for make listen)",
    )
    args = p.parse_args(argv)
    if args.derangements < 1 or args.bootstrap < 1:
        p.error("--derangements and --bootstrap must be >= 1")
    if not 0 <= args.seed < 2**32:
        p.error(f"--seed {args.seed}: must be in 0 .. 2**32 - 1 (numpy's seed range)")
    if args.text_max_tokens < 2:
        p.error("--text-max-tokens must be >= 2 (the begin and end tokens)")
    if bool(args.embeddings_generated) != bool(args.embeddings_reference):
        p.error("--embeddings-generated and --embeddings-reference go together")
    if bool(args.reference) == bool(args.reference_shards):
        p.error("give one of --reference (a directory of audio files) and --reference-shards (own-audio originals)")
    if args.reference_shards and not args.audio_root:
        p.error("--reference-shards needs --audio-root (where the samples' source_file paths start)")
    if args.reconstructed and args.reference_kind != "original" and not args.reference_shards:
        p.error("--reconstructed is the floor against ORIGINAL references: add --reference-kind original")
    return args


def main(argv: list[str] | None = None) -> int:
    from adapter_trainer.evaluation.audio_models import how_to_get, is_available

    args = parse_args(argv)
    if args.if_available:
        absent = [m for m in (args.clap, args.classifier) if not is_available(m)]
        if absent:
            print(f"adapter_trainer.audio_metrics: skipped: {how_to_get(absent[0])}")
            return 0
    out = Path(args.out)
    try:
        check_writable(out)
        report = compute(args)
    except UserError as e:  # ModelUnavailableError / WrongModelError included: one line, what to do
        print(f"adapter_trainer.audio_metrics: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(out)
    ci = report["clap_score_minus_deranged_ci"]
    kl = report["kl_classifier"]
    print(
        f"adapter_trainer.audio_metrics: {report['n_generated']} generated vs {report['n_reference']} reference clips "
        f"({report['reference_kind']}): CLAP score {report['clap_score']:.4f} (deranged captions "
        f"{report['clap_score_deranged']:.4f}, difference {ci['mean']:+.4f} [{ci['lo']:+.4f}, {ci['hi']:+.4f}]), "
        f"FAD(CLAP, per clip) {report['fad_clap_clips']:.4f}, KL {'n/a (no pairs)' if kl is None else f'{kl:.4f}'} "
        f"over {report['n_kl_pairs']} pairs -> {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

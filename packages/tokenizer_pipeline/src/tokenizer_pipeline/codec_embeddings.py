"""`python -m tokenizer_pipeline.codec_embeddings WAV_DIR --codec PATH_OR_ID --out emb.npy`: EnCodec encoder latents."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenizer_pipeline.codec.embeddings import run
from tokenizer_pipeline.errors import exit_code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tokenizer_pipeline.codec_embeddings", description=__doc__.split("\n")[0]
    )
    p.add_argument("wav_dir", type=Path, help="directory of <key>.wav (e.g. tokenizer_pipeline.decode's out_dir)")
    p.add_argument("--codec", required=True, help="EncodecModel directory or hub id in the local cache")
    p.add_argument("--out", type=Path, required=True, help="embeddings .npy ([frames, D]); a .json sidecar beside it")
    p.add_argument("--device", default="cpu", help="cpu | cuda | mps | auto")
    args = p.parse_args(argv)

    def embed() -> None:
        info = run(args.wav_dir, args.codec, args.out, args.device)
        print(
            f"codec_embeddings: {len(info['clips'])} clips, {info['frames']} frames x {info['dim']} -> {args.out} "
            f"(codec {info['codec']})"
        )

    return exit_code(embed, "tokenizer_pipeline.codec_embeddings: ")


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m tokenizer_pipeline.codec_embeddings WAV_DIR --codec PATH_OR_ID --out emb.npy`: EnCodec encoder latents.

A command module only: the code lives in `tokenizer_pipeline.codec.embeddings`.
"""

from tokenizer_pipeline.codec.embeddings import main

if __name__ == "__main__":
    raise SystemExit(main())

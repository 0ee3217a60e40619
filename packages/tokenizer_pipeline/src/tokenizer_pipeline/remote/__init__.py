"""Shard sets at URLs: push a local set to s3://, gs://, hf:// or a directory, and read one back to verify it.

    urls          which strings are URLs, the fsspec filesystem of one (one line naming the extra when missing)
    retry         capped exponential backoff with full jitter; one-line error naming the file, URL and last status
    local_set     the local set, checked before anything is sent: the files to push, in order (manifest last)
    destinations  a directory (temp file + rename) or an fsspec bucket (one PUT per object)
    hub           a Hugging Face dataset repo: tars in batched commits, then manifest.json + README.md
    dataset_card  the README.md of a Hub dataset repo, from the manifest's own fields
    push          the command: `python -m tokenizer_pipeline.push SET URL`
    fetch         a set at a URL read back one file at a time, for `python -m tokenizer_pipeline.verify URL`

The packages never import each other: adapter_trainer has its own reader (adapter_trainer.data.remote).
"""

"""Shard sets at URLs (s3://, gs://, hf://, http(s)://): read through fsspec into a verified, bounded local cache.

    urls      which strings are URLs, the fsspec filesystem of one, a Hub revision pinned to its commit
    retry     capped exponential backoff with jitter on timeouts, 5xx and 429; one-line error after the last try
    cache     ShardCache: content-addressed by the manifest's sha256, atomic renames, file locks, a hard byte bound
    planner   which shard this node reads next (from the example order), what to prefetch and what to evict

The manifest is read first; a shard is used only after its sha256 equals the manifest's (docs/real-data.md).
"""

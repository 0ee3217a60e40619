"""Shard sets at URLs (s3://, gs://, hf://, http(s)://): read through fsspec into a verified, bounded local cache.

`urls` (which strings are URLs, pinned Hub revisions), `retry` (backoff), `cache` (ShardCache), `planner` (what to
read, prefetch and evict next). A shard is used only after its sha256 equals the manifest's (docs/real-data.md).
"""

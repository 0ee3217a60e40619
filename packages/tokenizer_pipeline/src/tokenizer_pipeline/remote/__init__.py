"""Shard sets at URLs: push a local set to s3://, gs://, hf:// or a directory, and read one back to verify it."""

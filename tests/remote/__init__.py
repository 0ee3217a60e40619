"""Loopback servers (S3, a fault-injecting HTTP file server, a Hugging Face Hub stand-in) for the remote shard-set
tests and benchmark: `tests.remote.servers` holds them, `tests/remote/conftest.py` the fixtures."""

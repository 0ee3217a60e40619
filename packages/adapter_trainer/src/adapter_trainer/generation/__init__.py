"""The generation room: codes sampled from a trained adapter, written as a contract shard set."""

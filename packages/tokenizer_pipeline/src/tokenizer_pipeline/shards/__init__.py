"""The shard-set contract and its writer: the naming rule, the sample and manifest records, the tar writer, `verify`."""

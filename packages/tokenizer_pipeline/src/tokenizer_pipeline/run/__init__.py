"""One stage-1 run on 1 or N ranks: plan the shards, decide what to redo, decode, encode, write the manifest."""

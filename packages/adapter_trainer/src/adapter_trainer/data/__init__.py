"""The data room: shard sets read per docs/shard-format.md (`shards`), how a caption and [T, K] codes become one
training sequence (`token_layout`), caption dropout (`caption_dropout`) and the streamed, rank-split training
batches built in DataLoader workers (`streaming`). Integer tensors only: this room never sees audio or a codec."""

"""The data room: shard sets -> training sequences and batches (integer tensors only, never audio or a codec).

Shard sets read per docs/shard-format.md (`shards`), how a caption and [T, K] codes become one training sequence
(`token_layout`), caption dropout (`caption_dropout`) and the streamed, rank-split training batches built in DataLoader
workers (`streaming`)."""

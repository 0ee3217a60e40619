"""The data room: shard sets -> training sequences and batches (integer tensors only, never audio or a codec).

Shard sets read per docs/shard-format.md (the manifest: `shards`; the safe sample decoder: `samples`; the split index
over tar headers: `split_index`; random access to one clip: `clip_reader`), how a caption and [T, K] codes become one
training sequence (`token_layout`), caption dropout (`caption_dropout`) and the streamed, rank-split training batches
built in DataLoader workers (`streaming`), which end with the loop that started them (`worker_lifetime`)."""

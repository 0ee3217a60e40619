"""The data room: shard sets -> training sequences and batches (integer tensors only, never audio or a codec).

Manifest (`shards`), safe sample decoder (`samples`), split index (`split_index`), random access (`clip_reader`),
sequence layout (`token_layout`), caption dropout, and rank-split batches built in workers (`streaming`,
`worker_lifetime`)."""

"""What to encode: MusicCaps CSV rows, or your own tracks cut into planned segments (key, split, window, caption)."""

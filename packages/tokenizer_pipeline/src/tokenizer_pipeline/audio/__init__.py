"""Audio files in: probe a header and decode a window to float32 mono at a rate (soundfile, torchcodec, ffmpeg)."""

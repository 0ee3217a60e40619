"""The codec: load EnCodec (hub id or directory) and name it; audio -> codes, codes -> audio, encoder latents."""

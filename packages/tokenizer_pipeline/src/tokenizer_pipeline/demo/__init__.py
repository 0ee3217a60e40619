"""The embedded offline default: the stand-in corpus (and its own-audio layouts) and the demo codec."""

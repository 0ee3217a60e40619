"""The evaluation room: how a run is measured (no training step, no model construction)."""

"""The run directory: its files (layout, marker, checkpoints: below the engine, which writes them) and its
config.json (settings, input fingerprints, resume checks: above the models, which it rebuilds)."""

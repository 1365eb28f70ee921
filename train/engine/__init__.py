"""Task-agnostic training pieces: settings, the trainer, objectives, losses, similarities, data, inference,
character noise and figures. Imports no task, no run directory beyond its files (train.run.layout,
train.run.checkpoint), and no model family."""

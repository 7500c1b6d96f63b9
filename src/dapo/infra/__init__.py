"""Infrastructure every layer above may use: atomic files, checkpoints, metric tracking, progress, plots, timing."""

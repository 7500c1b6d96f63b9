"""Ranks enter here, once: the World (rank, world size, collectives; a single-process default) and how a batch of
whole prompt groups is shared among data-parallel ranks."""

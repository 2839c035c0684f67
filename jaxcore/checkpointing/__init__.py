"""Pieces of `jaxcore.checkpoint` that have their own job: portable weight files and the
per-checkpoint file manifest."""

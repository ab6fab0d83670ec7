"""Releases backed by versioned training checkpoints."""

"""API surfaces: translators between what a client speaks and the kernel (gateway/core/surface.py)."""

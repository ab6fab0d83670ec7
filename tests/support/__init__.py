"""Helpers for end-to-end tests that need real model weights (torch is optional)."""

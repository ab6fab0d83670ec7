"""The training side of releases: checkpoint manifests, a file-backed registry of versioned
checkpoints, and a helper that saves a step from a training loop.

A training job uses it without the gateway (it never imports `gateway`, import-linter holds that);
the gateway's releases read the same registry and verify against the same manifests.
"""

"""`gateway evals`: eval sets a model release must pass before promotion.

This package is an HTTP client of the OpenAI-compatible endpoint it evaluates, so it never imports
from `gateway`: the verdict must not depend on the code being judged.
"""

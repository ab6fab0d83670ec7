"""Small pieces that the gateway, `policies`, `replay`, `eval` and `sim` need.

It imports none of them (import-linter holds that, see pyproject.toml), so each may use it without
depending on the others: `replay` and `eval` measure the gateway and must not import it.
"""

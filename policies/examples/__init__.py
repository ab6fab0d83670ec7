"""Example policy files, shipped as package data so the demo finds them after a wheel install."""

"""The kernel: types and renderings every layer of the gateway shares, importing no feature."""

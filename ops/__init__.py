"""Operator tools for a running installation (not shipped in the image)."""

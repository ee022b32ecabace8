"""Operator tools for a running installation (not shipped in the image), and the generator of
the Helm chart from deploy/ (ops/chart/)."""

#!/usr/bin/env sh
# Rotate what Metacontroller presents to the hook, as a CompositeController SPEC change, the only
# change Metacontroller acts on (an annotation does not make it re-read a Secret):
#
#   deploy/rotate-credentials.sh token     # a new bearer token (also the first one after install)
#   deploy/rotate-credentials.sh tls       # deploy/mtls: pin the renewed client certificate and CA
#
# Needs python3 (3.11+, standard library only) and kubectl with rights to read and patch the
# Secrets involved, list and patch CompositeControllers (every one that names the Secret is
# rotated: pg-failover-hook, or each pg-failover-hook-<k> of deploy/sharding), list Events and
# exec into the hook pods.
# What it does and why: ops/rotation/__init__.py; docs/security.md, "Rotating the token".
set -eu
root=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m ops.rotation "$@"

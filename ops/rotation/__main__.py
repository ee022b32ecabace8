"""``python -m ops.rotation token|tls``: runs :func:`ops.rotation.cli.main`."""

import sys

from ops.rotation.cli import main

sys.exit(main())

"""``python -m ops.chart [--check]``: runs :func:`ops.chart.cli.main`."""

import sys

from ops.chart.cli import main

sys.exit(main())

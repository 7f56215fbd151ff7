"""``python -m tfrs_logq.cli``: the ``tfrs-logq`` command."""

import sys

from tfrs_logq.cli.app import main

sys.exit(main())

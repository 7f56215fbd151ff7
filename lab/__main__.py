"""``python -m lab``: the lab's commands (`lab.cli`)."""

import sys

from lab.cli import main

sys.exit(main())

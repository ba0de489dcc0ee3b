"""``python -m tests.fuzz N [--seed S] [--start I] [--show]``: run a fuzz campaign (``make fuzz`` runs 10,000 cases)."""

import sys

from tests.fuzz.driver import main

sys.exit(main())

"""``python3 -m rollcap.rollout.cli`` is the ``rollcap`` command."""

import sys

from rollcap.rollout.cli import main

sys.exit(main())

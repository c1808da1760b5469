"""`python -m sluice.audit ...`: the same as `sluice audit ...`."""

import sys

from sluice.audit.cli import main

sys.exit(main(sys.argv[1:]))

"""``python -m jobdeck.cli``: the same ``main`` as the ``jobdeck`` console script."""

import sys

from jobdeck.cli import main

sys.exit(main())

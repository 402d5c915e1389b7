"""``python -m numpy_transformer``: the ``numpy-transformer`` command (see ``cli.py``)."""

import sys

from .cli import main

sys.exit(main())

"""``python -m gatehouse VERB ...``: the ``gatehouse`` command (see ``gatehouse._cli``)."""

import sys

from ._cli import main

sys.exit(main())

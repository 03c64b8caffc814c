"""``python -m k8s.render``: see :mod:`k8s.render.cli`."""

import sys

from k8s.render.cli import main

sys.exit(main())

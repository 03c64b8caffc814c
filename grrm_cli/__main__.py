"""``python -m grrm_cli`` = the ``grrm`` console script."""

from grrm_cli.main import main

raise SystemExit(main())

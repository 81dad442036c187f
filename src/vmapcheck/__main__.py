"""``python -m vmapcheck <command>``: the same as the ``vmapcheck`` console script."""

from vmapcheck.cli import main

raise SystemExit(main())

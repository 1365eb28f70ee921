"""``python -m train``: the ``train`` console command (:func:`train.cli.main`)."""

from train.cli import main

raise SystemExit(main())

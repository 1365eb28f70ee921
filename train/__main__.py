"""``python -m train``: the ``train`` console command (:func:`pipelines.cli.main`). An entry point is the top
of the package graph: it may import the orchestrator, which imports every stage (``docs/ARCHITECTURE.md``)."""

from pipelines.cli import main

raise SystemExit(main())

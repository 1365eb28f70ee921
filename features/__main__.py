from features.cli import main

raise SystemExit(main())

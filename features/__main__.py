from features.entry import main

raise SystemExit(main())

from prep.cli import main

raise SystemExit(main())

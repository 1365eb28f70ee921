from vsecore.errors import interrupted_while_loading

with interrupted_while_loading("prep"):  # Ctrl-C while Python loads the command
    from prep.cli import main

raise SystemExit(main())

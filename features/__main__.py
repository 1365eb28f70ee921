from prep import interrupted_while_loading

with interrupted_while_loading("features"):  # Ctrl-C while Python loads the command
    from features.cli import main

raise SystemExit(main())

import sys

try:
    from prep.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python loads the command
    print("prep: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())

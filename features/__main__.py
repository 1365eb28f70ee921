import sys

try:
    from features.cli import main
except KeyboardInterrupt:  # Ctrl-C while numpy, zarr and torch load (a second or more)
    print("features: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())

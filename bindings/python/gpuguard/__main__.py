"""``python -m gpuguard ARGS`` — the gpuguard command line (the same program as ``gpuguard``)."""
from ._cli import main

raise SystemExit(main())

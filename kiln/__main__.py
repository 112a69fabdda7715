"""``python -m kiln ...`` runs the ``kiln`` command."""
import sys

from kiln.cli import main

sys.exit(main())

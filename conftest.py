"""Makes the repository's packages importable when tests run from a plain checkout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

"""Provider adapter tests: make tests/fakes importable (fakecli's flag tables, argv_cases)."""

from __future__ import annotations

import sys
from pathlib import Path

FAKES_DIR = Path(__file__).resolve().parents[1] / "fakes"
if str(FAKES_DIR) not in sys.path:
    sys.path.insert(0, str(FAKES_DIR))

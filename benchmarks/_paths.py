"""Put ``tests`` on ``sys.path``, so that the benchmarks import the study support package.

The fixtures shared by the tests, benchmarks and examples live in ``tests/support``
(imported as ``support``); a benchmark imports this module before them.
"""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

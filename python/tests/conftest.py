"""Test setup: use the installed fusednorm, or the source tree's python/ when none is installed
(developer mode: the library is then found in <repo>/build*/ or via FUSEDNORM_LIBRARY)."""

import pathlib
import sys

try:
    import fusednorm  # noqa: F401
except ImportError:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

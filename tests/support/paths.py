"""Where the tests find the project and their fixture files, wherever in tests/ a test lives."""

from __future__ import annotations

from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
TESTS = PROJECT / "tests"
FIXTURES = TESTS / "fixtures"

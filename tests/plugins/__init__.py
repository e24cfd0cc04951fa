"""pytest plugins with the real-infrastructure fixtures (listed in tests/conftest.py)."""

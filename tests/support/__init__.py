"""Test doubles and harnesses shared by the test folders (importable as `support.*`: pytest puts
tests/ on sys.path for tests/conftest.py). Nothing here ships in a package."""

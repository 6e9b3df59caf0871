"""The benchmark harness (``python3 bench/run.py``); not part of the test suite."""

"""The adversarial tier: API fuzzing, state-machine properties, the crash
matrix and database faults. Every test under this folder carries the
``adversarial`` marker, so ``pytest -m adversarial`` runs the tier alone and
CI runs it with everything else."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.adversarial)

"""The package's own store tests, run on StoreResponseProvider: azure-ai-agentserver-responses' sdist ships
tests/unit/test_file_response_store_parity.py, the scenarios its file store must pass to match its in-memory
provider (envelopes, items, history by previous_response_id and conversation, soft delete). Each of them runs here
as the package wrote it, with agent_store's provider in its file store's place, on both backends.

The sdist is fetched from PyPI (a package registry) at the version the agentserver extra pins."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import text

from agent_store import Store
from agent_store.agentserver.responses import StoreResponseProvider

SDIST = "azure-ai-agentserver-responses==2.3.0"
PARITY = "tests/unit/test_file_response_store_parity.py"


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    where = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SDIST,
                    "-d", str(where)], check=True, timeout=300)  # fmt: skip
    (archive,) = where.glob("*.tar.gz")
    with tarfile.open(archive) as sdist:
        member = next(m for m in sdist.getmembers() if m.name.endswith(PARITY))
        source = sdist.extractfile(member)
        assert source is not None
        path = where / "parity_scenarios.py"
        path.write_bytes(source.read())
    spec = importlib.util.spec_from_file_location("parity_scenarios", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_packages_parity_scenarios_pass(parity: ModuleType, store: Store, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    scenarios = {name: fn for name, fn in vars(parity).items() if name.startswith("test_") and
                 inspect.iscoroutinefunction(fn)}  # fmt: skip
    assert len(scenarios) >= 20, sorted(scenarios)  # the file as we know it: a shorter one is not the same test
    provider = StoreResponseProvider(store)

    def ours(_: Path) -> list[tuple[str, Any]]:
        return [("agent_store", lambda: provider)]

    monkeypatch.setattr(parity, "_make_provider_factories", ours)
    failed = []
    for name, scenario in sorted(scenarios.items()):
        try:
            await scenario(tmp_path)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
        async with store.engine.begin() as conn:  # the next scenario starts on empty tables
            for table in ("agent_hosted_links", "agent_hosted_items", "agent_hosted_responses"):
                await conn.execute(text(f"DELETE FROM {table}"))  # noqa: S608 (the names above)
    assert not failed, "\n".join(failed)

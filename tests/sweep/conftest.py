import pytest

from pgcluster import Cluster, Unavailable


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server on 127.0.0.1 for this test session (see tests/pgcluster.py);
    the tests using it skip, with the reason, where none can be started."""
    cluster = Cluster()
    try:
        cluster.start()
    except Unavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def launches(monkeypatch) -> list:
    """Every (ServerLauncher, process) a sweep starts, recorded as it starts."""
    from specbench.backends.launcher import ServerLauncher

    launched: list = []
    real_start = ServerLauncher.start

    def start(self):
        try:
            return real_start(self)
        finally:
            launched.append((self, self.proc))

    monkeypatch.setattr(ServerLauncher, "start", start)
    return launched

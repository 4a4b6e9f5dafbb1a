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

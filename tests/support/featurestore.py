"""Shared by several test modules; moved from tests/test_featurestore.py."""
import numpy as np
import pytest

import storage.featurestore as featurestore
from storage import (
    add_model_version,
    create_experiment,
    session_scope,
)


def new_version(engine) -> int:
    with session_scope(engine) as s:
        exp = create_experiment(s, name="e", method="bct", config={}, config_hash="h").id
        return add_model_version(s, exp, 1, architecture="a", method="bct", classes=[0], num_outputs=1,
                                 feature_dim=3).id


def arrays(n: int, d: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 5, n), np.arange(100, 100 + n)


@pytest.fixture
def s3_root(monkeypatch):
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e .[s3]); the S3 store is not tested")
    import boto3
    import fsspec
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="lab")
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    monkeypatch.setenv(featurestore.STORE_ENV, "s3://lab/features")
    fsspec.filesystem("s3").clear_instance_cache()
    yield fsspec.filesystem("s3", skip_instance_cache=True)
    server.stop()


"""freshet_client against a live freshet serve (started by
tests/ref/test_python_client.sh): a dense model "dense" (4-16-3, softmax)
and a sparse model "clicks", both training while the suite runs.

Each test checks the client's answer against the server's own bytes (the
raw float32 weights, the JSON of the same request) or against arithmetic
done here, to the digit.
"""

import json
import os
import re
import socket
import time
import urllib.request

import numpy as np
import pytest

from freshet_client import Client, FreshetError

URL = os.environ["FRESHET_URL"]
TOKEN = os.environ.get("FRESHET_TOKEN")


def raw(path, headers=None):
    req = urllib.request.Request(URL + path, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return dict(r.headers.items()), r.read()


@pytest.fixture
def client():
    return Client(URL, model="dense", token=TOKEN)


def test_the_client_is_the_installed_package():
    import freshet_client

    assert "site-packages" in freshet_client.__file__, freshet_client.__file__


def test_models_and_the_default_model():
    c = Client(URL)
    assert set(c.models()) >= {"dense", "clicks", "still"}
    assert c.metadata()["name"] == "dense"  # the server's default, asked for once
    meta = c.metadata("dense")
    assert meta["inputs"][0]["shape"] == [-1, 4]
    assert [o["name"] for o in meta["outputs"]] == ["probabilities", "argmax"]


def test_latest_equals_the_raw_weights(client):
    w = client.latest()
    assert w.layers == "4-16-3" and w.loss == "softmax"
    shapes = [(W.shape, b.shape) for W, b in w.layer_params()]
    assert shapes == [((16, 4), (16,)), ((3, 16), (3,))]
    # the server's raw float32 payload of the same version: the tensors in
    # layout order (training moves on meanwhile: read both again until they
    # agree on the version)
    for _ in range(50):
        h, body = raw("/v2/models/dense/weights?format=raw")
        if int(h["X-Freshet-Version"]) == w.version:
            break
        w = client.latest()
    assert int(h["X-Freshet-Version"]) == w.version
    flat = np.concatenate([np.concatenate([W.ravel(), b]) for W, b in w.layer_params()])
    np.testing.assert_array_equal(np.frombuffer(body, dtype="<f4"), flat)
    assert w.etag == h["ETag"]


def test_unchanged_weights_come_from_the_cache_by_their_etag():
    c = Client(URL, model="still", token=TOKEN)  # created, never trained
    first = c.latest()
    assert first.version == 0 and c.not_modified == 0
    again = c.latest()
    assert again is first  # a 304: nothing downloaded
    assert c.not_modified == 1 and c.attempts == 2


def test_wait_next_returns_a_newer_version(client):
    w = client.latest()
    t0 = time.monotonic()
    nxt = client.wait_next(w.version, timeout=10)
    assert nxt is not None, "no new version within 10 s while training"
    assert nxt.version > w.version or nxt.epoch != w.epoch
    assert time.monotonic() - t0 < 10
    assert client.latest().version >= nxt.version


def test_snapshot_is_the_retained_version(client):
    versions = [int(v) for v in client.metadata()["versions"][:-1]]
    assert versions, "no snapshot retained yet"
    v = versions[-1]
    s = client.snapshot(v)
    assert s.version == v
    _, body = raw(f"/v2/models/dense/versions/{v}/weights?format=raw")
    flat = np.concatenate([np.concatenate([W.ravel(), b]) for W, b in s.layer_params()])
    np.testing.assert_array_equal(np.frombuffer(body, dtype="<f4"), flat)
    with pytest.raises(FreshetError) as e:
        client.snapshot(10**12)
    assert e.value.status == 404 and "retains no snapshot" in e.value.message


def forward(w, x):
    """The model's forward pass in float64 numpy: ReLU, then softmax."""
    h = np.asarray(x, dtype=np.float64)
    params = w.layer_params()
    for i, (W, b) in enumerate(params):
        h = h @ W.T.astype(np.float64) + b
        if i < len(params) - 1:
            h = np.maximum(h, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_infer_on_a_snapshot_matches_numpy_and_torch(client):
    torch = pytest.importorskip("torch")
    v = int(client.metadata()["versions"][-2])
    s = client.snapshot(v)
    x = np.random.default_rng(5).normal(size=(7, 4)).astype(np.float32)
    p = client.infer(x, version=v, request_id="py-1")
    assert p.model_version == v and p.id == "py-1"
    assert p.probabilities.shape == (7, 3) and p.argmax.shape == (7,)
    np.testing.assert_allclose(p.probabilities, forward(s, x), atol=1e-6)
    np.testing.assert_array_equal(p.argmax, forward(s, x).argmax(axis=1))
    net = client.load_torch(s)
    with torch.no_grad():
        t = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(p.probabilities, t, atol=1e-6)
    # the latest weights by default; one output when asked
    only = client.infer(x[0], outputs=["argmax"])
    assert set(only.outputs) == {"argmax"} and only.argmax.shape == (1,)
    assert only.model_version >= v


def test_load_torch_of_the_latest_learns_the_clouds(client):
    torch = pytest.importorskip("torch")
    net = client.load_torch()
    centres = torch.tensor([[2, 0, 0, 1], [0, 2, 1, 0], [-1, -1, 2, 2]], dtype=torch.float32)
    with torch.no_grad():
        assert net(centres).argmax(dim=1).tolist() == [0, 1, 2]


def test_errors_carry_the_server_s_status_and_message(client):
    with pytest.raises(FreshetError) as e:
        client.infer(np.zeros((2, 5), dtype=np.float32))
    assert e.value.status == 400 and "takes 4 features" in e.value.message
    with pytest.raises(FreshetError) as e:
        client.latest("no-such-model")
    assert e.value.status == 404
    with pytest.raises(ValueError):  # JSON cannot carry it: refused before sending
        client.infer(np.array([1.0, np.nan, 0.0, 0.0]))


def test_retries_back_off_then_give_up():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    c = Client(f"http://127.0.0.1:{port}", model="dense", retries=3, backoff=0.05, timeout=1)
    t0 = time.monotonic()
    with pytest.raises(FreshetError) as e:
        c.latest()
    took = time.monotonic() - t0
    assert e.value.status is None
    assert c.attempts == 4  # the first and three retries
    assert took >= 0.05 + 0.1 + 0.2  # 50, 100, 200 ms between them


def test_delta_of_the_sparse_model():
    c = Client(URL, model="clicks", token=TOKEN)
    d = c.delta(0, max_rows=500)
    assert d.ids.dtype == np.uint32 and len(d.ids) == len(d.rows) > 0
    assert d.rows.shape[1] == 1 + 4  # the linear weight, then the embedding
    assert d.bias.shape == (1,)
    # the rows the delta names are the rows /rows reads at that moment or
    # later; their version moves only forward
    nxt = c.delta(d.next)
    assert int(nxt.version) >= int(d.version)
    _, body = raw(f"/v2/models/clicks/delta?since={d.next}&format=json")
    assert json.loads(body)["since"] == int(d.next)


def test_a_sparse_model_predicts_from_its_records():
    c = Client(URL, model="clicks", token=TOKEN)
    line = "\t".join(["0"] + ["3"] * 13 + ["68fd1e64"] * 26)  # a Criteo line
    p = c.infer_records([line, line.replace("68fd1e64", "80e26c9b")], request_id="sp")
    assert p.id == "sp" and p.model_version > 0
    assert p.probability.shape == (2, 1)
    assert ((p.probability > 0) & (p.probability < 1)).all()
    assert p.probability[0, 0] != p.probability[1, 0]  # other values, other rows
    with pytest.raises(FreshetError) as e:
        c.infer_records(["not a record"])
    assert e.value.status == 400 and "not a criteo record" in e.value.message


def test_the_readme_example_runs():
    text = open(os.environ["FRESHET_README"]).read()
    m = re.search(r"<!-- python client example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "README.md lacks the python client example"
    env = {"__name__": "__readme__"}
    exec(compile(m.group(1), "README.md", "exec"), env)
    assert env["p"].probabilities.shape == (1, 3)

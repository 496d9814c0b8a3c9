"""freshet serve over HTTP: weights (safetensors), long-poll, snapshots,
predictions (KServe v2 JSON) and a sparse model's deltas.

Every request is retried on a connection error and on 502, 503 and 504,
with exponential backoff (honouring Retry-After); other errors raise
FreshetError at once with the server's message. latest() keeps the last
weights with their ETag and asks with If-None-Match, so an unchanged model
costs a 304 and no download.
"""

import http.client
import json
import math
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

_DTYPES = {"F32": "<f4", "F64": "<f8", "U32": "<u4", "I32": "<i4", "I64": "<i8", "U8": "u1"}
_RETRY_STATUS = (502, 503, 504)


class FreshetError(Exception):
    """An answer other than the one asked for: status is the HTTP status
    (None when the server could not be reached), message the server's."""

    def __init__(self, status: Optional[int], message: str):
        super().__init__(f"{status}: {message}" if status is not None else message)
        self.status = status
        self.message = message


@dataclass
class Weights:
    """A dense model's weights at one (epoch, version)."""

    version: int
    epoch: str
    layers: str
    loss: str
    tensors: Dict[str, np.ndarray]
    metadata: Dict[str, str]
    etag: str = ""

    def layer_params(self) -> List[tuple]:
        """[(weight [out, in], bias [out]), ...] in layer order."""
        n = sum(1 for k in self.tensors if k.endswith(".weight"))
        return [(self.tensors[f"layers.{i}.weight"], self.tensors[f"layers.{i}.bias"]) for i in range(n)]


@dataclass
class Prediction:
    """An infer answer: the outputs by name (probabilities, argmax,
    probability or score) and the version that computed them."""

    model_version: int
    epoch: str
    outputs: Dict[str, np.ndarray]
    id: Optional[str] = None

    def __getattr__(self, name):
        try:
            return self.__dict__["outputs"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Delta:
    """A sparse model's rows changed since a version, and rows evicted."""

    ids: np.ndarray
    rows: np.ndarray
    tombstones: np.ndarray
    bias: np.ndarray
    version: int
    epoch: str
    next: str
    more: bool
    tower: Optional[np.ndarray] = None
    metadata: Dict[str, str] = field(default_factory=dict)


def parse_safetensors(data: bytes):
    """The tensors (numpy arrays, copied out of data) and the metadata of a
    safetensors image."""
    if len(data) < 8:
        raise FreshetError(None, "safetensors: shorter than its header length")
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise FreshetError(None, "safetensors: header runs past the end")
    header = json.loads(data[8 : 8 + hlen])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + hlen
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        if t["dtype"] not in _DTYPES:
            raise FreshetError(None, f"safetensors: tensor {name} has dtype {t['dtype']}")
        dt = np.dtype(_DTYPES[t["dtype"]])
        if not 0 <= a <= b or base + b > len(data) or (b - a) != dt.itemsize * int(
                np.prod(t["shape"], dtype=np.int64)):
            raise FreshetError(None, f"safetensors: tensor {name} does not fit its bytes")
        tensors[name] = np.frombuffer(data, dtype=dt, count=(b - a) // dt.itemsize, offset=base + a).reshape(t["shape"]).copy()
    return tensors, meta


class Client:
    """One freshet serve (or a load balancer before replicas).

    base_url: "http://host:port"; model: the default model of every call
    (None: the server's default, asked once); token: the bearer token
    (needed for reads when the server protects them); timeout: seconds a
    request may take (a long-poll adds its wait); retries: attempts after
    the first on connection errors and 502/503/504; backoff: the first
    pause in seconds, doubled each time (at most 5 s).
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8080", model: Optional[str] = None,
                 token: Optional[str] = None, timeout: float = 10.0, retries: int = 3,
                 backoff: float = 0.2):
        self.base_url = base_url.rstrip("/")
        self._model = model
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._cache: Dict[str, Weights] = {}
        self.attempts = 0  # HTTP requests sent, retries included
        self.not_modified = 0  # latest() answered from the cache (304)

    # ---- HTTP -------------------------------------------------------------

    def _request(self, method: str, path: str, body: Optional[bytes] = None,
                 headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None):
        """(status, headers, body) of the answer; 304 is returned, other
        statuses >= 400 raise after the retries they deserve."""
        url = self.base_url + path
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        pause = self.backoff
        for attempt in range(self.retries + 1):
            self.attempts += 1
            req = urllib.request.Request(url, data=body, method=method, headers=h)
            retry_after = None
            try:
                with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                    return r.status, dict(r.headers.items()), r.read()
            except urllib.error.HTTPError as e:
                data = e.read()
                if e.code == 304:
                    return 304, dict(e.headers.items()), b""
                if e.code not in _RETRY_STATUS or attempt == self.retries:
                    raise FreshetError(e.code, _message(data)) from None
                retry_after = e.headers.get("Retry-After")
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
                if attempt == self.retries:
                    reason = getattr(e, "reason", e)
                    raise FreshetError(None, f"{url}: {reason}") from None
            wait = min(pause, 5.0)
            if retry_after is not None and retry_after.isdigit():
                wait = max(wait, float(retry_after))  # the server's word, even if longer
            time.sleep(wait)
            pause *= 2
        raise AssertionError("unreachable")

    def _get_json(self, path: str):
        _, _, data = self._request("GET", path)
        return json.loads(data)

    def _name(self, model: Optional[str]) -> str:
        if model is not None:
            return model
        if self._model is None:
            default = self._get_json("/v2/models").get("default")
            if not default:
                raise FreshetError(None, "the server has no default model: name one (model=...)")
            self._model = default
        return self._model

    def _path(self, model: Optional[str], rest: str) -> str:
        return f"/v2/models/{urllib.parse.quote(self._name(model), safe='')}{rest}"

    # ---- models and weights ------------------------------------------------

    def models(self) -> List[str]:
        """The models in the store."""
        return self._get_json("/v2/models")["models"]

    def metadata(self, model: Optional[str] = None) -> dict:
        """The model's metadata (Open Inference Protocol shape)."""
        return self._get_json(self._path(model, ""))

    def _weights(self, status, headers, data) -> Weights:
        tensors, meta = parse_safetensors(data)
        return Weights(version=int(meta.get("freshet.version", headers.get("X-Freshet-Version", -1))),
                       epoch=meta.get("freshet.epoch", headers.get("X-Freshet-Epoch", "")),
                       layers=meta.get("freshet.layers", ""), loss=meta.get("freshet.loss", ""),
                       tensors=tensors, metadata=meta, etag=headers.get("ETag", ""))

    def latest(self, model: Optional[str] = None) -> Weights:
        """The latest weights. Asks with the ETag of the last ones this
        client got: unchanged weights cost a 304 and come from the cache."""
        name = self._name(model)
        cached = self._cache.get(name)
        headers = {"If-None-Match": cached.etag} if cached is not None and cached.etag else {}
        status, h, data = self._request("GET", self._path(name, "/weights"), headers=headers)
        if status == 304 and cached is not None:
            self.not_modified += 1
            return cached
        w = self._weights(status, h, data)
        self._cache[name] = w
        return w

    def wait_next(self, after: int, timeout: float = 30, model: Optional[str] = None) -> Optional[Weights]:
        """Weights of a version other than after (normally newer), waiting
        up to timeout seconds (at most 30) on the server's long-poll; None
        when none came."""
        name = self._name(model)
        wait = max(0, min(30, int(round(timeout))))
        status, h, data = self._request(
            "GET", self._path(name, f"/weights?after_version={int(after)}&wait={wait}"),
            timeout=self.timeout + wait)
        if status == 304:
            return None
        w = self._weights(status, h, data)
        self._cache[name] = w
        return w

    def snapshot(self, version: int, model: Optional[str] = None) -> Weights:
        """A retained snapshot of the current epoch (FreshetError 404 when
        it is not retained)."""
        status, h, data = self._request("GET", self._path(model, f"/versions/{int(version)}/weights"))
        return self._weights(status, h, data)

    def load_torch(self, weights: Optional[Weights] = None, model: Optional[str] = None):
        """A torch.nn.Sequential holding weights (default: latest()):
        Linear and ReLU layers, then Softmax(dim=1) for a softmax model or
        Sigmoid for a logistic one, so its output is infer()'s."""
        import torch

        w = weights if weights is not None else self.latest(model)
        mods = []
        params = w.layer_params()
        for i, (W, b) in enumerate(params):
            lin = torch.nn.Linear(W.shape[1], W.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(W))
                lin.bias.copy_(torch.from_numpy(b))
            mods.append(lin)
            if i < len(params) - 1:
                mods.append(torch.nn.ReLU())
        if w.loss == "softmax":
            mods.append(torch.nn.Softmax(dim=1))
        elif w.loss == "logistic":
            mods.append(torch.nn.Sigmoid())
        return torch.nn.Sequential(*mods).eval()

    # ---- predictions ---------------------------------------------------------

    def infer(self, x, version: Optional[int] = None, outputs: Optional[Sequence[str]] = None,
              model: Optional[str] = None, request_id: Optional[str] = None) -> Prediction:
        """Predictions for x ([n, d] or [d]) from the latest weights or a
        retained snapshot's (version); outputs picks some by name."""
        a = np.asarray(x, dtype=np.float32)
        if a.ndim == 1:
            a = a.reshape(1, -1)
        if a.ndim != 2:
            raise ValueError("x must be [n, d] or [d]")
        if not np.isfinite(a).all():
            raise ValueError("x holds a NaN or an infinity: JSON cannot carry it")
        body = {"inputs": [{"name": "x", "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}]}
        if version is not None:
            body["parameters"] = {"version": int(version)}
        if outputs is not None:
            body["outputs"] = [{"name": o} for o in outputs]
        if request_id is not None:
            body["id"] = request_id
        _, _, data = self._request("POST", self._path(model, "/infer"), body=json.dumps(body, allow_nan=False).encode(),
                                   headers={"Content-Type": "application/json"})
        return self._prediction(json.loads(data))

    @staticmethod
    def _prediction(ans) -> Prediction:
        outs = {}
        for o in ans["outputs"]:
            if o["datatype"] == "INT64":
                arr = np.asarray(o["data"], dtype=np.int64)
            else:  # a non-finite prediction comes as null
                arr = np.asarray([math.nan if v is None else v for v in o["data"]], dtype=np.float32)
            outs[o["name"]] = arr.reshape(o["shape"])
        return Prediction(model_version=int(ans["model_version"]), epoch=ans.get("parameters", {}).get("epoch", ""),
                          outputs=outs, id=ans.get("id"))

    def infer_records(self, records: Sequence[str], layout: Optional[str] = None,
                      model: Optional[str] = None, request_id: Optional[str] = None) -> Prediction:
        """A sparse model's predictions for records as its topic carries
        them: Criteo lines (default) or libsvm lines (layout="libsvm")."""
        body = {"inputs": [{"name": "records", "shape": [len(records)], "datatype": "BYTES",
                            "data": list(records)}]}
        if layout is not None:
            body["parameters"] = {"layout": layout}
        if request_id is not None:
            body["id"] = request_id
        _, _, data = self._request("POST", self._path(model, "/infer"), body=json.dumps(body, allow_nan=False).encode(),
                                   headers={"Content-Type": "application/json"})
        return self._prediction(json.loads(data))

    # ---- sparse models -------------------------------------------------------

    def delta(self, since, model: Optional[str] = None, max_rows: Optional[int] = None,
              epoch: Optional[str] = None) -> Delta:
        """A sparse model's rows changed since version since (0, or the
        next of the last delta or table page) and the rows evicted; more
        is True when another call is needed to catch up. FreshetError 410
        means reload the table."""
        q = f"/delta?since={urllib.parse.quote(str(since))}"
        if max_rows is not None:
            q += f"&max_rows={int(max_rows)}"
        if epoch is not None:
            q += f"&epoch={urllib.parse.quote(str(epoch))}"
        _, _, data = self._request("GET", self._path(model, q))
        t, meta = parse_safetensors(data)
        return Delta(ids=t["ids"], rows=t["rows"], tombstones=t["tombstones"], bias=t["bias"],
                     version=int(meta["freshet.version"]), epoch=meta["freshet.epoch"],
                     next=meta["freshet.next"], more=meta.get("freshet.more") == "true",
                     tower=t.get("tower"), metadata=meta)


def _message(data: bytes) -> str:
    try:
        return json.loads(data)["error"]
    except Exception:
        return data.decode("utf-8", "replace").strip()

"""`kvtier.open`: one entry for integrations, the same calls over an engine in this
process or a `kvtier serve`, one engine per process and settings, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import kvtier
from serve import Server

TPB = 16


def settings(tmp_path, name="data"):
    return {"ram": "64MiB", "data_dir": str(tmp_path / name), "ssd": {"enabled": False}}


def round_trip(kv: kvtier.Cache) -> bytes:
    layout = kv.register_layout("py-open", "f16", TPB, 2, 2, 64)
    tokens = list(range(3 * TPB))
    data = np.random.default_rng(3).integers(0, 256, 3 * layout.block_bytes, dtype=np.uint8)
    assert kv.store(layout, tokens, data)["stored"] in (0, 3)
    hit = kv.lookup(layout, tokens)
    out = np.zeros(hit.nbytes, dtype=np.uint8)
    assert kv.load_into(hit, out) == 3
    assert out.tobytes() == data.tobytes()
    return out.tobytes()


def test_one_engine_per_process_and_settings(tmp_path):
    a = kvtier.open(settings=settings(tmp_path))
    b = kvtier.open(settings=settings(tmp_path))
    other = kvtier.open(settings=settings(tmp_path, "other"))
    assert a is b and a is not other
    assert isinstance(a, kvtier.Engine) and isinstance(a, kvtier.Cache) and a.embedded
    round_trip(a)
    # What one caller stored, the other sees: it is the same engine.
    layout = b.register_layout("py-open", "f16", TPB, 2, 2, 64)
    assert b.lookup(layout, list(range(3 * TPB))).blocks == 3
    assert other.lookup(other.register_layout("py-open", "f16", TPB, 2, 2, 64), list(range(3 * TPB))).blocks == 0
    # Closed, the next open starts a new engine.
    a.close()
    with pytest.raises(kvtier.ClosedError):
        b.stats()
    c = kvtier.open(settings=settings(tmp_path))
    assert c is not a and not c.closed
    c.close()
    other.close()


def test_a_server_through_open_answers_as_the_engine_does(tmp_path):
    server = Server(tmp_path / "served", "--set", "ssd.enabled=false")
    try:
        served = kvtier.open(url=server.url)
        assert isinstance(served, kvtier.Client) and not served.embedded
        assert served.kv_events() is None
        with kvtier.Engine(settings(tmp_path)) as local:
            assert round_trip(served) == round_trip(local)
        with pytest.raises(kvtier.InvalidError, match="admin API"):
            served.flush()
    finally:
        server.stop()


def test_bad_arguments_and_settings_are_invalid(tmp_path):
    with pytest.raises(kvtier.InvalidError, match="not both"):
        kvtier.open(url="http://127.0.0.1:1", settings={})
    with pytest.raises(kvtier.InvalidError, match="token"):
        kvtier.open(settings=settings(tmp_path), token="t")
    with pytest.raises(kvtier.InvalidError, match="unknown field"):
        kvtier.open(settings={"data_dir": str(tmp_path), "no_such_setting": 1})
    with pytest.raises(kvtier.InvalidError):
        kvtier.open(settings={"data_dir": str(tmp_path), "ram": "lots"})
    with pytest.raises(kvtier.InvalidError):
        kvtier.open(config_file=tmp_path / "missing.toml")


def test_the_exception_classes_are_the_cores_error_kinds():
    from kvtier import _kvtier, errors

    assert sorted(errors._BY_KIND) == sorted(_kvtier.ERROR_KINDS)
    for name in _kvtier.ERROR_KINDS:
        e = errors.error_for(name, "m")
        assert e.kind == name and type(e) is not errors.KvtierError


def test_an_unreachable_server_is_unavailable_and_an_unreachable_s3_tier_a_degraded_start(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A kvtier serve nobody runs: the first call says so.
    gone = kvtier.open(url=f"http://127.0.0.1:{port}")
    with pytest.raises(kvtier.UnavailableError):
        gone.register_layout("py-open", "f16", TPB, 2, 2, 64)
    # An S3 endpoint nobody runs: the engine starts degraded, not down (docs/adr/0012):
    # RAM and SSD serve, the remote tier counts its failures.
    settings = {
        "ram": "64MiB",
        "data_dir": str(tmp_path / "degraded"),
        "ssd": {"enabled": False},
        "remote": {"endpoints": [f"http://127.0.0.1:{port}"], "deadline": "500ms"},
    }
    with kvtier.Engine(settings) as kv:
        round_trip(kv)
        assert kv.stats()["remote_io_errors"] >= 1


def test_an_unreachable_s3_tier_is_unavailable_when_required_at_start(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The same endpoint nobody runs, with the strict setting: the open fails, and fails as
    # an outage (retry later), not as bad settings.
    data = tmp_path / "strict"
    settings = {
        "ram": "64MiB",
        "data_dir": str(data),
        "remote": {
            "endpoints": [f"http://127.0.0.1:{port}"],
            "deadline": "500ms",
            "require_at_start": True,
            # Credentials given, so the failure is the endpoint's, not a credential lookup's.
            "access_key": "kvtier-test",
            "secret_key": "kvtier-test-secret",
        },
    }
    with pytest.raises(kvtier.UnavailableError, match="require_at_start") as e:
        kvtier.open(settings=settings)
    assert f"127.0.0.1:{port}" in str(e.value) and "connect" in str(e.value).lower()
    # Nothing was opened before the check: no SSD store was made.
    assert not (data / "ssd").exists()

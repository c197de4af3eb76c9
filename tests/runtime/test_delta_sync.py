"""Delta weight sync (weight_sync_backend delta): the trainer's half publishes what changed since its last publish,
in SkyRL 0.4's format, to a local directory or an S3-compatible store (moto's server, started here); engines patch
their copy of the checkpoint and load it, and hold the trainer's weights after every sync. SkyRL's own publisher and
loader are the referee of the format."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.inference.hf import HFEngine  # noqa: E402
from rlc.runtime.inference.http import RemoteEngine, make_server  # noqa: E402
from rlc.runtime.models import load_causal_lm  # noqa: E402
from rlc.runtime.weights.delta import DeltaSyncError, LocalCheckpoint, Publisher  # noqa: E402
from rlc.runtime.weights.storage import StoreError, open_store  # noqa: E402


def _settings(sync_dir: str, local: Path) -> dict:
    return {
        "sync_dir": sync_dir,
        "local_checkpoint_dir": str(local),
        "max_file_bytes": 16 << 10,  # several payload files for the tiny model
        "publish_num_workers": 2,
        "cloud_download_workers": 2,
    }


def _step(model, names: list[str] | None = None, seed: int = 0) -> None:
    """A training step's worth of change to some of the weights (all of them when `names` is None)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if names is None or name in names:
                p.add_(torch.randn(p.shape, generator=g) * 1e-2)


def _assert_holds(engine: HFEngine, trainer) -> None:
    theirs = trainer.state_dict()
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, theirs[name].to(tensor.dtype)), name


def _sync_three_times(tiny_model: str, sync_dir: str, tmp_path: Path) -> list[dict]:
    """Three publishes (all weights, then two tensors, then none), each loaded by an engine; a second engine joins at
    the last one and catches up from the base checkpoint through every version."""
    trainer = load_causal_lm(tiny_model, dtype=torch.float32)
    engine = HFEngine(tiny_model)
    settings = _settings(sync_dir, tmp_path / "engine-copy")
    publisher = Publisher(Path(tiny_model), sync_dir, settings["max_file_bytes"], 2)
    names = [n for n, _ in trainer.named_parameters()]
    updates = []
    for version, changed in ((1, None), (2, names[:2]), (3, [])):
        _step(trainer, changed, seed=version)
        update = publisher.publish(trainer.state_dict().items())
        updates.append(update)
        assert engine.update_weights_delta(update, settings, version) == version
        _assert_holds(engine, trainer)
    late = HFEngine(tiny_model)
    late.update_weights_delta(updates[-1], _settings(sync_dir, tmp_path / "late-copy"), 3)
    _assert_holds(late, trainer)
    return updates


def test_a_local_directory_carries_only_what_changed(tiny_model, tmp_path):
    sync_dir = tmp_path / "sync"
    first, second, third = _sync_three_times(tiny_model, str(sync_dir), tmp_path)
    manifests = [json.loads((sync_dir / f"delta-0000000{v}" / "manifest.json").read_text()) for v in (1, 2, 3)]
    assert [(m["version"], m["base_version"]) for m in manifests] == [(1, 0), (2, 1), (3, 2)]
    assert len(manifests[0]["payload_files"]) > 1  # max_file_bytes splits the first publish
    assert len(manifests[1]["tensors"]) == 2 and second["changed_tensors"] == 2
    assert manifests[2]["tensors"] == [] and manifests[2]["payload_files"] == []


def test_an_s3_store_carries_the_weights(tiny_model, tmp_path, s3_bucket):
    _sync_three_times(tiny_model, s3_bucket, tmp_path)
    store = open_store(s3_bucket + "/delta-00000002")
    assert json.loads(store.get("manifest.json"))["base_version"] == 1


def test_a_version_not_published_is_named(tiny_model, tmp_path, s3_bucket):
    copy = LocalCheckpoint(tiny_model, tmp_path / "copy")
    with pytest.raises(
        DeltaSyncError,
        match=r"version 1 is not published: s3://rlc-sync-\w+/run-1/delta-00000001/manifest.json does not exist",
    ):
        copy.fetch({"target_version": 1, "sync_dir": s3_bucket})


def _skyrl_delta_checkpoint(monkeypatch):
    """SkyRL 0.4's delta checkpoint module, loaded from its file: importing its package (skyrl.backends) pulls in its
    Tinker API, whose pydantic models need Python 3.12. The module itself needs torch, numpy, safetensors, zstandard."""
    skyrl = pytest.importorskip("skyrl")
    pytest.importorskip("xxhash")  # SkyRL's publisher checksums with xxh3-128
    folder = Path(skyrl.__file__).parent / "backends" / "skyrl_train" / "weight_sync" / "delta"
    package = "skyrl.backends.skyrl_train.weight_sync.delta"
    modules = {}
    for name in ("payload", "checkpoint"):
        spec = importlib.util.spec_from_file_location(f"{package}.{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, f"{package}.{name}", module)
        spec.loader.exec_module(module)
        modules[name] = module
    return modules["checkpoint"]


def test_skyrls_loader_applies_rlcs_deltas_and_rlc_applies_skyrls(tiny_model, tmp_path, monkeypatch):
    checkpoint = _skyrl_delta_checkpoint(monkeypatch)
    trainer = load_causal_lm(tiny_model, dtype=torch.float32)
    _step(trainer, seed=1)
    ours = tmp_path / "ours"
    update = Publisher(Path(tiny_model), str(ours), 1 << 30).publish(trainer.state_dict().items())
    store = checkpoint.LocalCheckpointStore(tiny_model, str(tmp_path / "skyrl-copy"))
    store.fetch(target_version=update["target_version"], sync_dir=update["sync_dir"])
    loaded = dict(checkpoint.CheckpointIndex(store.weights_dir).iter_tensors())
    assert loaded and all(torch.equal(t, trainer.state_dict()[n]) for n, t in loaded.items())

    _step(trainer, seed=2)
    theirs = tmp_path / "theirs"
    publisher = checkpoint.DeltaCheckpointPublisher(tiny_model, str(theirs), str(tmp_path / "staging"))
    publisher.publish(publisher.create_delta_files(trainer.state_dict().items()))
    copy = LocalCheckpoint(tiny_model, tmp_path / "rlc-copy")
    copy.fetch({"target_version": 1, "sync_dir": str(theirs)})
    assert all(torch.equal(t, trainer.state_dict()[n]) for n, t in copy.tensors())


def test_a_corrupt_patch_fails_its_checksum(tiny_model, tmp_path):
    trainer = load_causal_lm(tiny_model, dtype=torch.float32)
    _step(trainer, seed=1)
    sync_dir = tmp_path / "sync"
    update = Publisher(Path(tiny_model), str(sync_dir), 1 << 30).publish(trainer.state_dict().items())
    manifest_path = sync_dir / "delta-00000001" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["tensors"][0]["checksum"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DeltaSyncError, match="differ from the published"):
        LocalCheckpoint(tiny_model, tmp_path / "copy").fetch(update)


def test_rlcs_server_loads_a_delta_over_http(tiny_model, tmp_path):
    engine = HFEngine(tiny_model)
    server = make_server(engine, "127.0.0.1", 0, "tiny")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        remote = RemoteEngine(f"127.0.0.1:{server.server_address[1]}", connect_timeout_s=30)
        remote.connect()
        trainer = load_causal_lm(tiny_model, dtype=torch.float32)
        _step(trainer, seed=1)
        sync_dir = str(tmp_path / "sync")
        update = Publisher(Path(tiny_model), sync_dir, 1 << 30).publish(trainer.state_dict().items())
        assert remote.update_weights_delta(update, _settings(sync_dir, tmp_path / "copy"), 1) == 1
        _assert_holds(engine, trainer)
    finally:
        server.shutdown()
        server.server_close()


def test_gcs_without_its_client_is_refused_by_name():
    try:
        import google.cloud.storage  # noqa: F401
    except ImportError:
        with pytest.raises(StoreError, match=r"gs://bucket/run needs google-cloud-storage"):
            open_store("gs://bucket/run")
    else:
        pytest.skip("google-cloud-storage is installed: the gs:// store opens")


def test_a_place_deltas_cannot_go_is_named_before_any_sync(tmp_path, s3_bucket):
    open_store(s3_bucket).check()
    open_store(str(tmp_path / "new" / "sync")).check()  # made if missing
    with pytest.raises(StoreError, match=r"cannot reach the bucket of s3://no-such-bucket/run: .*Not Found"):
        open_store("s3://no-such-bucket/run").check()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreError, match=r"cannot create .*a-file/sync"):
        open_store(str(tmp_path / "a-file" / "sync")).check()


def test_a_copy_removed_or_cut_short_starts_over_from_the_base_checkpoint(tiny_model, tmp_path):
    trainer = load_causal_lm(tiny_model, dtype=torch.float32)
    publisher = Publisher(Path(tiny_model), str(tmp_path / "sync"), 1 << 30)
    copy = LocalCheckpoint(tiny_model, tmp_path / "copy")
    for seed in (1, 2):
        _step(trainer, seed=seed)
        update = publisher.publish(trainer.state_dict().items())
    assert copy.fetch(update) == {"from_version": 0, "version": 2}
    shutil.rmtree(copy.weights)
    assert copy.fetch(update) == {"from_version": 0, "version": 2}  # not patched again on the base's bytes
    state = json.loads(copy.state_path.read_text())
    copy.state_path.write_text(json.dumps({**state, "write_in_progress": True}))
    assert copy.fetch(update) == {"from_version": 0, "version": 2}
    assert all(torch.equal(t, trainer.state_dict()[n]) for n, t in copy.tensors())

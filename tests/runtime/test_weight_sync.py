"""Weight sync: full weights streamed out of FSDP2 shards, chunked by module, broadcast to an engine process
outside the trainer's process group, and packed into buckets for CUDA IPC."""

from __future__ import annotations

import os
import traceback

import pytest

torch = pytest.importorskip("torch")

import torch.multiprocessing as mp  # noqa: E402
from rlc.runtime.weights.broadcast import close_group, init_group, receive_weights, send_weights  # noqa: E402
from rlc.runtime.weights.ipc import (  # noqa: E402
    BucketEntry,
    ipc_buckets,
    ipc_handle,
    open_ipc_handle,
    pack_ipc_bucket,
    unpack_bucket,
)
from rlc.runtime.weights.tensors import WeightMeta, chunk_by_module, dtype_name, iter_full_params, metas_of  # noqa: E402
from rlc.runtime.workers.fsdp import free_address  # noqa: E402

TIMEOUT = 120  # seconds; bounds every queue read, join and collective, so a broken run fails instead of hanging
RECEIVE_CHUNK = 40 * 1024  # bytes: the tiny model's attention and MLP modules (8-32 KiB each) land in several chunks


def _report_errors(who: str, results, body) -> None:
    try:
        body()
    except BaseException:
        results.put(("error", who, traceback.format_exc()))
        raise


def _copies(stream):
    return [(n, None if t is None else t.clone()) for n, t in stream]


def _trainer(rank: int, fsdp_port: int, sync_port: int, model_path: str, out: str, results, metas_q) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    def body():
        from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
        from rlc.spec.model import default_model
        from torch.distributed.tensor import DTensor

        spec = default_model().to_typed({"version": 1})
        worker = FSDPWorker(WorkerSettings("policy", model_path), spec.trainer.policy, spec.trainer.algorithm, rank, 2)
        worker.setup("127.0.0.1", fsdp_port)
        model = worker.model
        fp32 = _copies(iter_full_params(model))
        bf16 = _copies(iter_full_params(model, torch.bfloat16))
        everyone = _copies(iter_full_params(model, rank0_only=False))
        report = {
            "sharded": all(isinstance(v, DTensor) for v in model.state_dict().values()),
            "names": [n for n, _ in fp32],
            "all_none": all(t is None for _, t in fp32 + bf16),
        }
        torch.save(everyone, os.path.join(out, f"everyone{rank}.pt"))
        # Move the trainer's weights away from the checkpoint, through the shards, as an optimizer step would.
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().mul_(-2.0).add_(0.5)
        if rank == 0:
            report["planned_bf16"] = metas_of(model.state_dict().items(), torch.bfloat16) == metas_of(bf16)
            planned = metas_of(model.state_dict().items())
            metas_q.put(planned)  # in the runtime the driver hands these to the engines
            group = init_group("127.0.0.1", sync_port, 0, 2, backend="gloo", timeout_s=TIMEOUT)
            sent: list = []

            def recorded():
                for name, tensor in iter_full_params(model):
                    sent.append((name, tensor.clone()))
                    yield name, tensor

            report["sent_as_planned"] = send_weights(group, recorded()) == planned
            close_group(group)
            torch.save({"fp32": fp32, "bf16": bf16, "sent": sent}, os.path.join(out, "trainer.pt"))
        else:
            for _ in iter_full_params(model):  # rank 0's gathers need this rank, though it keeps nothing
                pass
        worker.shutdown()
        results.put(("ok", f"trainer{rank}", report))

    _report_errors(f"trainer{rank}", results, body)


def _engine(sync_port: int, model_path: str, out: str, results, metas_q) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    def body():
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(1234)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path)).float()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        metas = metas_q.get(timeout=TIMEOUT)
        group = init_group("127.0.0.1", sync_port, 1, 2, backend="gloo", timeout_s=TIMEOUT)
        chunks = []

        def load(chunk):
            chunks.append([(n, t.numel() * t.element_size()) for n, t in chunk])
            result = model.load_state_dict(dict(chunk), strict=False)
            assert not result.unexpected_keys, result.unexpected_keys

        count = receive_weights(group, metas, "cpu", load, chunk_bytes=RECEIVE_CHUNK)
        close_group(group)
        torch.save({"before": before, "after": model.state_dict(), "chunks": chunks}, os.path.join(out, "engine.pt"))
        results.put(("ok", "engine", {"count": count}))

    _report_errors("engine", results, body)


def _join_all(procs, results) -> dict:
    """Each process's report; fails at the first error a process reports, and never waits past TIMEOUT."""
    reports = {}
    try:
        for _ in procs:
            kind, who, value = results.get(timeout=TIMEOUT)
            if kind == "error":
                pytest.fail(f"{who} failed:\n{value}")
            reports[who] = value
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0, p
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return reports


def _two_ports() -> tuple[int, int]:
    a = free_address()[1]
    b = free_address()[1]
    while b == a:
        b = free_address()[1]
    return a, b


@pytest.fixture(scope="module")
def synced(tiny_model, tmp_path_factory):
    """Two FSDP2 trainer ranks (their own gloo default group) and a third engine process that is in no group."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("weight-sync")
    ctx = mp.get_context("spawn")
    results, metas_q = ctx.Queue(), ctx.Queue()
    fsdp_port, sync_port = _two_ports()
    procs = [
        ctx.Process(target=_trainer, args=(r, fsdp_port, sync_port, tiny_model, str(out), results, metas_q))
        for r in range(2)
    ]
    procs.append(ctx.Process(target=_engine, args=(sync_port, tiny_model, str(out), results, metas_q)))
    for p in procs:
        p.start()
    reports = _join_all(procs, results)
    reports["everyone"] = [torch.load(out / f"everyone{r}.pt") for r in range(2)]
    return reports, torch.load(out / "trainer.pt"), torch.load(out / "engine.pt")


@pytest.fixture(scope="module")
def unsharded(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()


def test_rank0_streams_the_unsharded_state_dict_in_order(synced, unsharded):
    reports, trainer, _ = synced
    assert reports["trainer0"]["sharded"]
    assert [n for n, _ in trainer["fp32"]] == list(unsharded)
    for name, tensor in trainer["fp32"]:
        assert tensor.dtype == torch.float32 and torch.equal(tensor, unsharded[name]), name


def test_floating_weights_are_cast_while_streaming(synced, unsharded):
    _, trainer, _ = synced
    assert [n for n, _ in trainer["bf16"]] == list(unsharded)
    for name, tensor in trainer["bf16"]:
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, unsharded[name].to(torch.bfloat16)), name


def test_other_ranks_take_part_but_get_no_values(synced, unsharded):
    reports, _, _ = synced
    assert reports["trainer1"]["names"] == list(unsharded)
    assert reports["trainer1"]["all_none"]
    for stream in reports["everyone"]:  # unless every rank asks for the values (the CUDA IPC path)
        assert [n for n, _ in stream] == list(unsharded)
        for name, tensor in stream:
            assert torch.equal(tensor, unsharded[name]), name


def test_metas_are_known_before_any_gather(synced):
    reports, _, _ = synced
    assert reports["trainer0"]["planned_bf16"]
    assert reports["trainer0"]["sent_as_planned"]


def test_engine_outside_the_trainer_group_receives_the_trainers_weights(synced, unsharded):
    reports, trainer, engine = synced
    sent = dict(trainer["sent"])
    assert reports["engine"]["count"] == len(sent) == len(unsharded)
    for name, before in unsharded.items():
        assert torch.equal(sent[name], before * -2.0 + 0.5), name  # the trainer's own, moved weights
        assert torch.equal(engine["after"][name], sent[name]), name
        assert not torch.equal(engine["before"][name], sent[name]), name  # the engine really started elsewhere


def test_engine_loads_whole_modules_in_bounded_chunks(synced, unsharded):
    _, _, engine = synced
    chunks = engine["chunks"]
    assert len(chunks) > 2
    assert [n for chunk in chunks for n, _ in chunk] == list(unsharded)
    modules = [{n.rpartition(".")[0] for n, _ in chunk} for chunk in chunks]
    for first, second in zip(modules, modules[1:]):
        assert not first & second
    for chunk, mods in zip(chunks, modules):
        assert sum(b for _, b in chunk) <= RECEIVE_CHUNK or len(mods) == 1
    for chunk, following in zip(chunks, chunks[1:]):  # full: the next module would not have fitted
        first = following[0][0].rpartition(".")[0]
        assert sum(b for _, b in chunk) + sum(b for n, b in following if n.rpartition(".")[0] == first) > RECEIVE_CHUNK


def _plain_member(rank: int, port: int, expect: list, results) -> None:
    """A process in no default group at all; rank 0 sends two tensors, rank 1 expects `expect`."""

    def body():
        group = init_group("127.0.0.1", port, rank, 2, backend="gloo", timeout_s=TIMEOUT)
        if rank == 0:
            send_weights(group, [("a.weight", torch.ones(3)), ("a.bias", torch.zeros(2, dtype=torch.int64))])
            results.put(("ok", "sender", None))
        else:
            try:
                receive_weights(group, expect, "cpu", lambda chunk: None)
                results.put(("ok", "receiver", "no error"))
            except RuntimeError as e:
                results.put(("ok", "receiver", str(e)))
        close_group(group)

    _report_errors(f"member{rank}", results, body)


def _two_members(target, *args) -> dict:
    """Ranks 0 and 1 of a fresh gloo group, each `target(rank, port, *args, results)` in its own process."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_address()[1]
    procs = [ctx.Process(target=target, args=(r, port, *args, results)) for r in range(2)]
    for p in procs:
        p.start()
    return _join_all(procs, results)


def test_a_receiver_expecting_other_weights_raises():
    wrong = [WeightMeta("a.weight", "float32", (3,)), WeightMeta("a.scale", "int64", (2,))]  # a name differs
    assert "disagreement" in _two_members(_plain_member, wrong)["receiver"]


def _bucket_tensors() -> list:
    g = torch.Generator().manual_seed(3)
    return [
        ("a.weight", torch.randn(4, 3, generator=g)),
        ("a.bias", torch.randn(3, generator=g)),
        ("b.weight", torch.randn(20, generator=g)),
        ("b.count", torch.arange(5)),
        ("c.weight", torch.randn(2, 2, generator=g).to(torch.bfloat16)),
        ("c.bias", torch.randn(2, generator=g)),
    ]


def _bucket_member(rank: int, port: int, results) -> None:
    """Rank 0 sends `_bucket_tensors` in 64-byte buckets; rank 1 reports what arrived and how many collectives ran."""

    def body():
        from rlc.runtime.weights import broadcast as weight_sync

        group = init_group("127.0.0.1", port, rank, 2, backend="gloo", timeout_s=TIMEOUT)
        calls = []
        original = weight_sync.broadcast_tensor
        weight_sync.broadcast_tensor = lambda tensor, *args: (
            calls.append(tuple(tensor.shape)),
            original(tensor, *args),
        )[1]
        if rank == 0:
            send_weights(group, _bucket_tensors(), bucket_bytes=64)
            results.put(("ok", "sender", calls))
        else:
            metas = [WeightMeta(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in _bucket_tensors()]
            got = []
            receive_weights(
                group, metas, "cpu", lambda chunk: got.extend((n, t.clone()) for n, t in chunk), bucket_bytes=64
            )
            results.put(("ok", "receiver", (got, calls)))
        close_group(group)

    _report_errors(f"member{rank}", results, body)


def test_broadcast_buckets_carry_consecutive_tensors_of_a_dtype():
    reports = _two_members(_bucket_member)
    got, calls = reports["receiver"]
    # 48 + 12 bytes of float32, then 80 (alone: over 64), the int64s, the bfloat16s, the last float32s; then
    # the fingerprint.
    assert calls == reports["sender"] == [(15,), (20,), (5,), (4,), (2,), (2,)]
    expected = _bucket_tensors()
    assert [n for n, _ in got] == [n for n, _ in expected]
    for (_, value), (_, want) in zip(got, expected):
        assert value.dtype == want.dtype and torch.equal(value, want)


def _sleeping_engine_member(rank: int, port: int, model_path: str, results) -> None:
    """Rank 0 broadcasts the model's weights x 1.5; rank 1 is an hf engine that dropped its weights (level-2 sleep)
    and wakes them, receives, then wakes its KV cache: a colocated GPU run's sync, in that order."""

    def body():
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from transformers import AutoModelForCausalLM

        sent = {k: v * 1.5 for k, v in AutoModelForCausalLM.from_pretrained(model_path).state_dict().items()}
        sent["model.mtp_layers.0.input_proj.weight"] = torch.ones(2, 4)  # an MTP head (trainer.mtp): not the engine's
        if rank == 0:
            group = init_group("127.0.0.1", port, 0, 2, backend="gloo", timeout_s=TIMEOUT)
            send_weights(group, list(sent.items()))
            close_group(group)
            results.put(("ok", "sender", None))
            return
        from rlc.runtime.inference.base import Sampling
        from rlc.runtime.inference.hf import HFEngine

        engine = HFEngine(model_path)
        engine.sleep(level=2)
        asleep = not engine.weights_on
        engine.wake_up(["weights"])
        engine.init_weight_group("127.0.0.1", port, 1, 2, "gloo")
        version = engine.receive_weights(metas_of(list(sent.items())), version=3)
        engine.wake_up(["kv_cache"])
        engine.close_weight_group()
        got = engine.model.state_dict()
        same = all(torch.equal(got[k], v) for k, v in sent.items() if not k.startswith("model.mtp_layers."))
        out = engine.generate([[1, 5, 6]], Sampling(max_generate_length=4), n=2)
        results.put(("ok", "engine", (asleep, version, same, [len(c.token_ids) for c in out[0]])))

    _report_errors(f"member{rank}", results, body)


def test_an_engine_that_dropped_its_weights_takes_a_broadcast(tiny_model):
    asleep, version, same, lengths = _two_members(_sleeping_engine_member, tiny_model)["engine"]
    assert asleep and version == 3 and same
    assert len(lengths) == 2 and all(0 < n <= 4 for n in lengths)  # it generates with them


@pytest.mark.parametrize("rank", [0, 1], ids=["host-whose-peers-never-come", "member-whose-host-never-comes"])
def test_forming_a_group_alone_times_out(rank):
    with pytest.raises(torch.distributed.DistError):
        init_group("127.0.0.1", free_address()[1], rank, 2, backend="gloo", timeout_s=1)


# -- chunk_by_module ---------------------------------------------------------------------------------------


def _named(spec):
    return [(name, torch.zeros(n, dtype=torch.uint8)) for name, n in spec]


def _layout(chunks):
    return [[n for n, _ in chunk] for chunk in chunks]


def test_chunks_keep_modules_whole_and_respect_the_threshold():
    items = _named(
        [
            ("a.q.weight", 40),
            ("a.q.bias", 10),
            ("a.k.weight", 40),
            ("a.k.bias", 10),
            ("a.norm.weight", 20),
            ("head.weight", 30),
        ]
    )
    assert _layout(chunk_by_module(items, 100)) == [
        ["a.q.weight", "a.q.bias", "a.k.weight", "a.k.bias"],  # 100 bytes: exactly at the threshold
        ["a.norm.weight", "head.weight"],
    ]
    assert _layout(chunk_by_module(items, 60)) == [
        ["a.q.weight", "a.q.bias"],
        ["a.k.weight", "a.k.bias"],
        ["a.norm.weight", "head.weight"],
    ]


def test_a_module_larger_than_the_threshold_travels_alone():
    items = _named([("a.weight", 10), ("big.weight", 70), ("big.bias", 40), ("c.weight", 10), ("d.weight", 10)])
    assert _layout(chunk_by_module(items, 50)) == [["a.weight"], ["big.weight", "big.bias"], ["c.weight", "d.weight"]]


def test_chunking_keeps_order_and_every_item():
    items = _named([(f"layers.{i % 3}.w{i}", 7 + i) for i in range(20)] + [("top", 5)])
    for threshold in (1, 30, 64, 1000):
        assert [n for chunk in chunk_by_module(iter(items), threshold) for n, _ in chunk] == [n for n, _ in items]
    assert list(chunk_by_module([], 10)) == []
    with pytest.raises(ValueError):
        list(chunk_by_module(items, 0))


# -- buckets -----------------------------------------------------------------------------------------------


def test_pack_and_unpack_round_trip_mixed_dtypes_aligned():
    g = torch.Generator().manual_seed(0)
    named = [
        ("embed.weight", torch.randn(5, 3, generator=g)),
        ("norm.weight", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("positions", torch.arange(11, dtype=torch.int64)),
        ("scale", torch.tensor(2.5)),
        ("empty", torch.zeros(0, 4)),
        ("transposed", torch.randn(4, 6, generator=g).t()),  # not contiguous: packing copies it in order
    ]
    buffer, entries = pack_ipc_bucket(named, "cpu", alignment=64)
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1
    assert all(e.offset % 64 == 0 for e in entries)
    spans = sorted((e.offset, e.offset + e.nbytes) for e in entries)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no overlaps
    unpacked = unpack_bucket(buffer, entries)
    assert [n for n, _ in unpacked] == [n for n, _ in named]
    for (_, original), (_, view) in zip(named, unpacked):
        assert view.dtype == original.dtype and view.shape == original.shape
        assert torch.equal(view, original)
    assert unpacked[0][1].data_ptr() == buffer.data_ptr() + entries[0].offset  # views, not copies


def test_unpack_refuses_entries_that_do_not_fit():
    buffer, entries = pack_ipc_bucket([("w", torch.ones(4))], "cpu")
    with pytest.raises(ValueError):
        unpack_bucket(buffer, [BucketEntry("w", "float32", (8,), entries[0].offset, 32)])
    with pytest.raises(ValueError):
        unpack_bucket(buffer, [BucketEntry("w", "float32", (3,), 0, 16)])


def test_weight_meta_normalises_shapes():
    meta = WeightMeta("w", "bfloat16", [2, 3])
    assert meta == WeightMeta("w", "bfloat16", torch.Size([2, 3]))
    assert meta.torch_dtype is torch.bfloat16 and meta.nbytes == 12
    with pytest.raises(ValueError):
        _ = WeightMeta("w", "Tensor", (1,)).torch_dtype


def test_chunk_sizes_count_the_padding_of_the_packed_bucket():
    items = _named([("a.w", 10), ("b.w", 10), ("c.w", 10), ("d.w", 10), ("e.w", 10)])
    assert _layout(chunk_by_module(items, 100)) == [["a.w", "b.w", "c.w", "d.w", "e.w"]]
    # Packed at 64-byte boundaries: a at 0-10, b at 64-74, c would end at 138.
    assert _layout(chunk_by_module(items, 100, alignment=64)) == [["a.w", "b.w"], ["c.w", "d.w"], ["e.w"]]
    with pytest.raises(ValueError):
        list(chunk_by_module(items, 100, alignment=0))


def _decoder_like() -> list[tuple[str, torch.Tensor]]:
    """State-dict-ordered tensors in three dtypes; the embedding (1280 bytes) is one tensor larger than 600."""
    g = torch.Generator().manual_seed(0)
    named = [("embed_tokens.weight", torch.randn(40, 8, generator=g))]
    for i in range(3):
        named += [
            (f"layers.{i}.attn.q.weight", torch.randn(6, 8, generator=g).to(torch.bfloat16)),
            (f"layers.{i}.attn.q.bias", torch.randn(6, generator=g).to(torch.bfloat16)),
            (f"layers.{i}.attn.o.weight", torch.randn(8, 6, generator=g).to(torch.bfloat16)),
            (f"layers.{i}.mlp.up.weight", torch.randn(5, 8, generator=g)),
            (f"layers.{i}.norm.weight", torch.randn(8, generator=g)),
            (f"layers.{i}.norm.steps", torch.tensor([i], dtype=torch.int64)),
        ]
    return named + [("norm.weight", torch.randn(8, generator=g)), ("lm_head.weight", torch.randn(10, 8, generator=g))]


def test_ipc_buckets_hold_whole_modules_within_the_threshold_and_round_trip():
    named, threshold = _decoder_like(), 600
    buckets = list(ipc_buckets(iter(named), threshold, "cpu"))
    modules = [[e.name.rpartition(".")[0] for e in entries] for _, entries in buckets]
    assert [e.name for e in buckets[0][1]] == ["embed_tokens.weight"]  # larger than the threshold: alone
    assert buckets[0][0].numel() == 1280
    assert len(buckets) > 3
    for buffer, entries in buckets[1:]:
        assert buffer.numel() <= threshold
        assert all(e.offset % 256 == 0 for e in entries)
    for mods, following in zip(modules, modules[1:]):
        assert not set(mods) & set(following)  # no module is split
    tensors = dict(named)
    for (_, entries), following in zip(buckets, buckets[1:]):  # full: the next module would not have fitted
        first = following[1][0].name.rpartition(".")[0]
        module = [f for f in following[1] if f.name.rpartition(".")[0] == first]
        grown = [(e.name, tensors[e.name]) for e in entries + module]
        assert pack_ipc_bucket(grown, "cpu")[0].numel() > threshold
    unpacked = [item for buffer, entries in buckets for item in unpack_bucket(buffer, entries)]
    assert [n for n, _ in unpacked] == [n for n, _ in named]
    for name, view in unpacked:
        assert view.dtype == tensors[name].dtype and torch.equal(view, tensors[name]), name


def test_ipc_buckets_hold_on_to_nothing_they_packed_or_yielded():
    """Once a chunk is packed its (gathered) tensors are freed: besides the bucket, only the stream's next
    module and the tensor read to find its end are alive. A bucket the caller dropped is freed before the
    next chunk is gathered."""
    import gc
    import weakref

    named, alive, dropped, dropped_alive = _decoder_like(), {}, [], []

    def stream():
        for name, tensor in named:
            if dropped:
                gc.collect()
                dropped_alive.append(dropped[0]() is not None)
            fresh = tensor.clone()
            alive[name] = weakref.ref(fresh)
            yield name, fresh

    buckets = ipc_buckets(stream(), 600, "cpu")
    buffer, _ = next(buckets)
    dropped.append(weakref.ref(buffer))
    del buffer
    _, entries = next(buckets)
    assert dropped_alive and not any(dropped_alive)
    gc.collect()
    rest = [n for n, _ in named][[n for n, _ in named].index(entries[-1].name) + 1 :]
    module = [n for n in rest if n.rpartition(".")[0] == rest[0].rpartition(".")[0]]
    assert {name for name, ref in alive.items() if ref() is not None} == {*module, rest[len(module)]}


# -- CUDA IPC (needs a GPU) --------------------------------------------------------------------------------


def _ipc_receiver(handle, entries, results) -> None:
    def body():
        buffer = open_ipc_handle(handle)
        results.put(("ok", "receiver", [(n, t.float().sum().item()) for n, t in unpack_bucket(buffer, entries)]))

    _report_errors("receiver", results, body)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")
def test_cuda_ipc_bucket_opens_in_another_process():
    named = [
        ("a.weight", torch.randn(32, 16)),
        ("a.bias", torch.arange(16, dtype=torch.int64)),
        ("b.weight", torch.randn(8, dtype=torch.float32).to(torch.bfloat16)),
    ]
    buffer, entries = pack_ipc_bucket(named, "cuda")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_ipc_receiver, args=(ipc_handle(buffer), entries, results))
    proc.start()
    sums = _join_all([proc], results)["receiver"]
    assert [n for n, _ in sums] == [n for n, _ in named]
    for (_, got), (_, t) in zip(sums, named):
        assert got == pytest.approx(t.float().sum().item(), rel=1e-6, abs=1e-6)


def _ipc_engine(model_path: str, out: str, requests, results) -> None:
    """An hf engine on the GPU: loads each bucket it is sent and acknowledges it, then saves its weights."""

    def body():
        from rlc.runtime.inference.hf import HFEngine

        engine = HFEngine(model_path, dtype="bfloat16", device="cuda")
        loaded = 0
        while (request := requests.get(timeout=TIMEOUT)) is not None:
            loaded += engine.update_weights_ipc(*request)
            results.put(("ack", "engine", loaded))
        version = engine.finish_weight_update(4)
        torch.save({k: v.cpu() for k, v in engine.model.state_dict().items()}, os.path.join(out, "engine.pt"))
        results.put(("ok", "engine", {"version": version, "loaded": loaded}))

    _report_errors("engine", results, body)


def _next_message(results, kind: str):
    got, who, value = results.get(timeout=TIMEOUT)
    if got == "error":
        pytest.fail(f"{who} failed:\n{value}")
    assert got == kind, (got, who, value)
    return value


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")
def test_a_colocated_engine_loads_the_policys_weights_from_cuda_ipc_buckets(tiny_model, tmp_path):
    """An FSDP2 policy rank packs its gathered bf16 weights bucket by bucket; an hf engine on the same GPU, in
    another process, loads each one before the next is packed."""
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model

    spec = default_model().to_typed({"version": 1})
    worker = FSDPWorker(
        WorkerSettings("policy", tiny_model, device="cuda", bf16=True),
        spec.trainer.policy,
        spec.trainer.algorithm,
        0,
        1,
    )
    worker.setup("127.0.0.1", free_address()[1])
    ctx = mp.get_context("spawn")
    requests, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_ipc_engine, args=(tiny_model, str(tmp_path), requests, results))
    proc.start()
    threshold, buckets = 48 * 1024, []
    try:
        with torch.no_grad():
            for p in worker.model.parameters():
                p.to_local().mul_(-2.0).add_(0.5)
        worker.start_ipc_weights("bfloat16", threshold)
        while (bucket := worker.next_ipc_bucket()) is not None:
            handles, entries = bucket
            buckets.append((max(e.offset + e.nbytes for e in entries), {e.name.rpartition(".")[0] for e in entries}))
            requests.put((handles, entries))
            _next_message(results, "ack")
        requests.put(None)
        report = _next_message(results, "ok")
        proc.join(timeout=30)
        expected = worker.full_state_dict("bfloat16")
    finally:
        if proc.is_alive():
            proc.kill()
        worker.shutdown()
    assert len(buckets) > 2
    assert all(size <= threshold or len(modules) == 1 for size, modules in buckets)
    assert report == {"version": 4, "loaded": len(expected)}
    engine = torch.load(tmp_path / "engine.pt")
    for name, tensor in expected.items():
        assert engine[name].dtype == torch.bfloat16 and torch.equal(engine[name], tensor), name

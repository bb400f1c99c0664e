"""The connector's file names are LMCache's own (``curvine.connector.naming``).

``naming`` copies LMCache 0.5.6's private functions so that the connector and
LMCache's file connectors on a mount name (and so share) the same files; these checks
hold the copies to the originals for real keys: the in-process engine's
``CacheEngineKey`` (``FSConnector._get_file_name``) including model names with '/',
tags from request configs and every dtype the key accepts, and the multiprocess
mode's ``ObjectKey`` (``fs_l2_adapter._object_key_to_filename``) including salts,
ranks and object groups.  Skipped without LMCache.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch (scripts/install-lmcache.sh)")
pytest.importorskip("lmcache.v1.storage_backend.connector.fs_connector",
                    reason="needs lmcache (scripts/install-lmcache.sh)")

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import (  # noqa: E402
    _filename_to_object_key, _object_key_to_filename)
from lmcache.v1.storage_backend.connector.fs_connector import FSConnector  # noqa: E402

from curvine.connector import naming  # noqa: E402

pytestmark = pytest.mark.lmcache

MODELS = ["Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "gpt2",
          "org/sub/deep/model-v1.2_x", "/leading/and/trailing/", "name with space"]
HASHES = [0, 1, 0xDEADBEEF, -1, -(1 << 63), (1 << 64) - 1, 12345678901234567890,
          -9876543210]


def _fs_name(key) -> str:
    # the method uses nothing of the instance: call it unbound, as LMCache would
    return FSConnector._get_file_name(None, key)


def _engine_keys():
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.uint8]
    configs = [None, {}, {"lmcache.tag.user": "alice"},
               {"lmcache.tag.user": "bob", "lmcache.tag.tenant": "t/1", "other": "x"}]
    for model in MODELS:
        for h in HASHES:
            for dt in dtypes:
                for rc in configs:
                    for world, worker in [(1, 0), (8, 7)]:
                        try:
                            yield CacheEngineKey(model, world, worker, h, dt, rc)
                        except ValueError:  # a dtype this LMCache does not name
                            continue


def test_engine_key_names_equal_lmcache_fs_connector_names():
    keys = list(_engine_keys())
    assert len(keys) > 500
    for key in keys:
        name = naming.engine_key_name(key)
        assert name == _fs_name(key), key
        assert "/" not in name and name.endswith(".data")
        # what the fs connector's list() returns for that file: its stem
        assert naming.engine_key_of_name(name) == name[:-len(".data")]
    assert naming.engine_key_of_name("x.tmp") is None
    assert naming.engine_key_of_name("x.data.tmp") is None


def test_engine_key_names_of_a_real_prompt_match(tmp_path):
    """Keys as LMCache's token database makes them for a prompt (ChunkedTokenDatabase
    with its default hash), not hand-built ones."""
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.token_database import ChunkedTokenDatabase
    cfg = LMCacheEngineConfig.from_dict({"chunk_size": 256})
    meta = LMCacheMetadata(model_name="Qwen/Qwen2.5-7B-Instruct", world_size=1,
                           local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=torch.bfloat16, kv_shape=(28, 2, 256, 4, 128),
                           chunk_size=256)
    db = ChunkedTokenDatabase(cfg, meta)
    keys = [k for _, _, k in db.process_tokens(torch.arange(2048) * 7 + 11)]
    assert len(keys) == 8
    names = [naming.engine_key_name(k) for k in keys]
    assert names == [_fs_name(k) for k in keys]
    assert len(set(names)) == 8
    assert all(n.startswith("Qwen-SEP-Qwen2.5-7B-Instruct@1@0@") for n in names)


def _object_keys():
    hashes = [b"", b"\x00", bytes(range(16)), b"\xff" * 32, ObjectKey.IntHash2Bytes(12345)]
    for model in MODELS:
        for h in hashes:
            for rank in [0, 1, (8 << 24) | (3 << 16) | (4 << 8) | 2, 0xFFFFFFFF]:
                for group in [0, 1, 255, 4096]:
                    for salt in ["", "alice", "tenant-1_x.y", "s" * 128]:
                        yield ObjectKey(chunk_hash=h, model_name=model, kv_rank=rank,
                                        object_group_id=group, cache_salt=salt)


def test_object_key_names_equal_lmcache_fs_l2_adapter_names():
    keys = list(_object_keys())
    assert len(keys) > 1000
    for key in keys:
        name = naming.object_key_name(key)
        assert name == _object_key_to_filename(key), key
        assert "/" not in name
        # LMCache's fs adapter finds the key again from the name (its startup scan)
        back = _filename_to_object_key(name)
        assert back is not None and back.chunk_hash == key.chunk_hash
        assert (back.kv_rank, back.object_group_id, back.cache_salt) == \
            (key.kv_rank, key.object_group_id, key.cache_salt)

"""LMCache's file names for its keys, so that the connector and LMCache's own file
connectors on a curvine mount name (and so share) the same chunk files.

Copied from LMCache 0.5.6 rather than imported: the functions are private there
(``FSConnector._get_file_name``, ``fs_l2_adapter._object_key_to_filename``), and
tests/test_connector_naming.py checks these against LMCache's own for real keys.
"""

from __future__ import annotations

DATA_SUFFIX = ".data"
_SLASH = "-SEP-"
_KEY_SEP = "@"


def engine_key_name(key) -> str:
    """The in-process engine's ``fs://`` connector name of a CacheEngineKey:
    ``key.to_string()`` with '/' as '-SEP-', plus '.data'."""
    return key.to_string().replace("/", _SLASH) + DATA_SUFFIX


def engine_key_of_name(name: str) -> str | None:
    """The key string of a chunk file name (None if it is not one): what the
    ``fs://`` connector's ``list()`` returns (its files' stems, '-SEP-' kept)."""
    if not name.endswith(DATA_SUFFIX):
        return None
    return name[: -len(DATA_SUFFIX)]


def object_key_name(key) -> str:
    """The multiprocess-mode ``fs`` L2 adapter's name of an ObjectKey:
    ``<model>@0x<kv_rank:08x>@<group:x>@<chunk hash hex>[@<cache salt>].data``."""
    model = key.model_name.replace("/", _SLASH)
    base = (f"{model}{_KEY_SEP}{key.kv_rank:#010x}{_KEY_SEP}{key.object_group_id:x}"
            f"{_KEY_SEP}{key.chunk_hash.hex()}")
    if key.cache_salt:
        return f"{base}{_KEY_SEP}{key.cache_salt}{DATA_SUFFIX}"
    return base + DATA_SUFFIX

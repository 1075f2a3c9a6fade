"""What `mqstore start` and `mqstore recover` are asked for: a TOML file and flags.

The file has a [store] table of StoreConfig fields and an optional [supervisor] table of
SupervisorSettings fields (restart_* keys are RestartSettings fields). Every key and value type
is checked before anything runs, so a typo or a wrong type is one clear error, not a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import typing

from engine.config import (
    StoreConfig,
    check_setting_types,
    config_from_tables,
    max_body_room_bytes,
    parse_flush_policy,
    read_config_tables,
    refuse_unfit_body_limit,
    store_table,
)
from workers.restart_policy import RestartSettings
from workers.supervisor import SupervisorSettings

RESTART_PREFIX = "restart_"

log = logging.getLogger(__name__)


def supervisor_setting_types() -> dict[str, type]:
    """[supervisor] key -> value type: SupervisorSettings fields and restart_<RestartSettings>."""
    own = typing.get_type_hints(SupervisorSettings)
    restart = typing.get_type_hints(RestartSettings)
    types = {f.name: own[f.name] for f in dataclasses.fields(SupervisorSettings) if f.name != "restart"}
    types.update({RESTART_PREFIX + f.name: restart[f.name] for f in dataclasses.fields(RestartSettings)})
    return types


def supervisor_settings(table: dict, path: str) -> SupervisorSettings:
    """SupervisorSettings from a [supervisor] table (keys and types checked first)."""
    check_setting_types(table, supervisor_setting_types(), "[supervisor]", path)
    restart = {k[len(RESTART_PREFIX):]: v for k, v in table.items() if k.startswith(RESTART_PREFIX)}
    other = {k: v for k, v in table.items() if not k.startswith(RESTART_PREFIX)}
    return SupervisorSettings(restart=RestartSettings(**restart), **other)


def load_settings(args: argparse.Namespace) -> tuple[StoreConfig, SupervisorSettings]:
    """StoreConfig and SupervisorSettings from --config and the flags (flags win)."""
    config = StoreConfig()
    settings = SupervisorSettings()
    path = getattr(args, "config", None)
    if path:
        tables = read_config_tables(path)  # read once: both tables come from the same file contents
        config = config_from_tables(tables, path)
        settings = supervisor_settings(tables.get("supervisor", {}), path)
    if getattr(args, "index_shards", None) is not None:
        config = config.replace(index_shards=args.index_shards)
    if getattr(args, "flush", None) is not None:
        config = config.replace(flush=parse_flush_policy(args.flush))
    return config, settings


def asked_store_settings(args: argparse.Namespace) -> dict[str, tuple[object, str]]:
    """The store settings given explicitly (setting -> (value, where)), so a frozen one that
    differs from store.json can be refused naming both; defaults are not asked for."""
    asked: dict[str, tuple[object, str]] = {}
    path = getattr(args, "config", None)
    if path:
        for name, value in store_table(path).items():
            asked[name] = (value, str(path))
    if getattr(args, "index_shards", None) is not None:
        asked["index_shards"] = (args.index_shards, "--index-shards")
    return asked


def fit_body_limit(config: StoreConfig, segment_bytes: int, asked: dict[str, tuple[object, str]]
                   ) -> StoreConfig:
    """`config` with a max_body_bytes a commitlog segment of `segment_bytes` holds, before anything
    is written: an asked limit that does not fit is refused (BadInputError); the default is
    lowered to what fits, and the log says so (a store made with small segments starts)."""
    if "max_body_bytes" in asked:
        refuse_unfit_body_limit(config.replace(commitlog_file_size=segment_bytes))
        return config
    room_bytes = max_body_room_bytes(segment_bytes)
    if config.max_body_bytes <= room_bytes:
        return config
    log.warning("max_body_bytes: the default %d does not fit a commitlog segment of %d bytes; "
                "%d is used (bodies of at most that are accepted)", config.max_body_bytes,
                segment_bytes, room_bytes)
    return config.replace(max_body_bytes=room_bytes)

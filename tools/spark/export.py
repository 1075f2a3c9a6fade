"""`mqstore spark export`: the store's messages as Parquet (JSON, ORC, CSV), by topic and date.

The result counts what this run wrote (its new data files read back), never what it read.
Timestamps go to Parquet as TIMESTAMP_MICROS adjusted to UTC (pyarrow reads
`timestamp[us, tz=UTC]`), not Spark's legacy INT96. CSV cannot hold arrays, maps or binary:
keys are joined with spaces, properties become a JSON object and the body base64.

Mode `incremental` is idempotent and resumable: the output directory keeps a ledger,
`_mqstore_export.json` (Spark's readers skip names starting with `_`): the commit position
exported up to and every data file of the runs that finished. A run first removes data files
not in the ledger (left by a run that died before recording itself), exports the records in
[ledger position, what the store has made durable), then replaces the ledger atomically. So a
run that dies anywhere is redone whole by the next, and no message is written twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from engine.errors import BadInputError
from engine.files.filesystem import write_file_atomically
from tools.spark.layout import read_layout
from tools.spark.session import read_store
from tools.spark.stream import readable_end_pos

Say = Callable[[str], None]
LEDGER_FILE = "_mqstore_export.json"
FORMATS = ("parquet", "json", "orc", "csv")
PARQUET_TIMESTAMP_CONF = "spark.sql.parquet.outputTimestampType"


class ExportMode(Enum):
    """Spark's save modes, and INCREMENTAL (append what the last run did not, see the module doc)."""

    ERRORIFEXISTS = "errorifexists"
    OVERWRITE = "overwrite"
    APPEND = "append"
    IGNORE = "ignore"
    INCREMENTAL = "incremental"


@dataclass
class ExportResult:
    path: str
    format: str
    rows: int
    partitions: list[str] = field(default_factory=list)
    start_pos: int | None = None
    end_pos: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def data_files(root: Path) -> set[str]:
    """Relative paths of the data files under `root` (no `_`/`.`-prefixed part: Spark's own
    metadata, checksums and this ledger)."""
    out = set()
    for path in root.rglob("*") if root.is_dir() else ():
        rel = path.relative_to(root)
        if path.is_file() and not any(part.startswith(("_", ".")) for part in rel.parts):
            out.add(str(rel))
    return out


def _flat_for_csv(df):
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    return (df.withColumn("keys", F.array_join("keys", " ")).withColumn("properties", F.to_json("properties"))
            .withColumn("body", F.regexp_replace(F.base64("body"), "[\\r\\n]", "")))  # no MIME line breaks


def _write(spark, df, to: Path, fmt: str, mode: str) -> None:
    writer = df.write.partitionBy("topic", "date").mode(mode).format(fmt)
    if fmt == "csv":
        writer = writer.option("header", "true")
    previous = spark.conf.get(PARQUET_TIMESTAMP_CONF, None)
    spark.conf.set(PARQUET_TIMESTAMP_CONF, "TIMESTAMP_MICROS")
    try:
        writer.save(str(to))
    finally:
        if previous is None:
            spark.conf.unset(PARQUET_TIMESTAMP_CONF)
        else:
            spark.conf.set(PARQUET_TIMESTAMP_CONF, previous)


def _written(spark, to: Path, fmt: str, files: set[str]) -> tuple[int, list[str]]:
    """Rows in `files` and their topic=/date= directories."""
    if not files:
        return 0, []
    reader = spark.read.format(fmt).option("header", "true") if fmt == "csv" else spark.read.format(fmt)
    rows = reader.load([str(to / f) for f in sorted(files)]).count()
    return rows, sorted({str(Path(f).parent) for f in files})


def _read_ledger(to: Path, store: Path, fmt: str, options: Mapping[str, str]) -> dict | None:
    path = to / LEDGER_FILE
    if not path.exists():
        return None
    ledger = json.loads(path.read_text())
    wanted = {"store": str(store), "format": fmt, "options": dict(options)}
    for key, value in wanted.items():
        if ledger.get(key) != value:
            raise BadInputError("to", f"{path} was written with {key} {ledger.get(key)!r}, not {value!r}; "
                                "export incrementally with the same store, format and options")
    return ledger


def export(spark, store: str | Path, to: str | Path, *, fmt: str = "parquet",
           mode: ExportMode = ExportMode.ERRORIFEXISTS, options: Mapping[str, str] | None = None,
           say: Say = lambda _: None) -> ExportResult:
    """Write the messages (after `options` filters) to `to`, partitioned by topic and date;
    report what this run wrote."""
    from pyspark.sql import functions as F  # noqa: N812

    if fmt not in FORMATS:
        raise BadInputError("format", f"{fmt!r} is not one of {', '.join(FORMATS)}")
    store, to, options = Path(store).resolve(), Path(to), dict(options or {})
    start_pos = end_pos = None
    read_options = dict(options)
    if mode is ExportMode.INCREMENTAL:
        if {k.lower() for k in options} & {"startpos", "endpos"}:
            raise BadInputError("option", "startPos/endPos are the ledger's to set in incremental mode")
        ledger = _read_ledger(to, store, fmt, options)
        for stale in data_files(to) - set(ledger["files"] if ledger else ()):
            os.unlink(to / stale)  # written by a run that died before its ledger
        start_pos = ledger["end_pos"] if ledger else 0
        end_pos = readable_end_pos(read_layout(store))
        read_options |= {"startPos": str(start_pos), "endPos": str(end_pos)}
    say(f"export: reading {store}, writing {fmt} to {to}")
    before = data_files(to)
    df = read_store(spark, str(store), **read_options).withColumn("date", F.to_date("store_ts"))
    _write(spark, _flat_for_csv(df) if fmt == "csv" else df, to, fmt,
           "append" if mode is ExportMode.INCREMENTAL else mode.value)
    after = data_files(to)
    if mode is ExportMode.INCREMENTAL:
        ledger = {"store": str(store), "format": fmt, "options": options, "end_pos": end_pos,
                  "files": sorted(after)}
        write_file_atomically(to / LEDGER_FILE, json.dumps(ledger, indent=1).encode())
    say("export: counting what was written")
    new = after if mode is ExportMode.OVERWRITE else after - before
    rows, parts = _written(spark, to, fmt, new)
    return ExportResult(str(to), fmt, rows, parts, start_pos, end_pos)

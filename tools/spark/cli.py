"""`mqstore spark <job>`: export, check, rebuild, stats on Spark (the main CLI calls these).

    mqstore spark export  --store DIR --to OUT [--format parquet|json|orc|csv]
                          [--mode errorifexists|overwrite|append|ignore|incremental]
    mqstore spark check   --store DIR [--json]          exit 1 when there are findings
    mqstore spark rebuild --store DIR [--json]
    mqstore spark stats   --store DIR [--json] [--plot PNG]
    common: --master URL (default: the configured spark.master, else local[*]),
            --conf KEY=VALUE (repeatable), --option KEY=VALUE
            (data source options: topics, startTime, ...; see docs/SPARK.md)

One line per stage goes to stderr; Spark shows its own stage progress bar there too.
"""

from __future__ import annotations

import argparse
import json
import sys

from workers.exit_codes import CliExit


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=argparse.SUPPRESS, help="store directory (default ./data)")
    p.add_argument("--master", help="Spark master URL (default: spark.master from MASTER or "
                   "spark-defaults.conf, else local[*])")
    p.add_argument("--conf", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="Spark configuration (repeatable)")
    p.add_argument("--option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="mqstore data source option, e.g. topics=a,b (repeatable)")


def add_spark_parser(subparsers) -> argparse.ArgumentParser:
    """Add `spark` with one sub-command per job to the main CLI's subparsers."""
    spark = subparsers.add_parser("spark", help="Spark jobs over store files",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    jobs = spark.add_subparsers(dest="job", required=True, metavar="JOB")
    p = jobs.add_parser("export", help="write every message as Parquet (or --format), by topic and date")
    _common(p)
    p.add_argument("--to", required=True, help="output directory")
    p.add_argument("--format", default="parquet", choices=("parquet", "json", "orc", "csv"),
                   help="output format (default parquet; csv flattens keys, properties and body)")
    p.add_argument("--mode", default="errorifexists",
                   choices=("errorifexists", "overwrite", "append", "ignore", "incremental"),
                   help="incremental: append only what earlier incremental runs did not write")
    p = jobs.add_parser("check", help="distributed fsck: records, consume queues, index coverage")
    _common(p)
    p.add_argument("--json", action="store_true")
    p = jobs.add_parser("rebuild", help="rebuild consume queues and index files from the commitlog")
    _common(p)
    p.add_argument("--json", action="store_true")
    p = jobs.add_parser("stats", help="per topic/queue counts, bytes, rates, key cardinality, sizes")
    _common(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="PNG", help="also draw a chart into this PNG file")
    spark.set_defaults(func=run_spark)
    return spark


def _say(line: str) -> None:
    print(f"mqstore spark: {line}", file=sys.stderr, flush=True)


def run_spark(args: argparse.Namespace) -> int:
    """Run the job named by `args.job`; returns the exit code."""
    from tools.spark import jobs

    store = getattr(args, "store", None) or "./data"
    _say(f"starting Spark ({args.master or jobs.configured_master() or 'local[*]'})")
    spark = jobs.spark_session(args.master, dict(args.conf), app_name=f"mqstore-{args.job}")
    try:
        return _run_job(jobs, spark, args, store)
    finally:
        spark.stop()


def _run_job(jobs, spark, args: argparse.Namespace, store: str) -> int:
    options = dict(args.option)
    if args.job == "export":
        result = jobs.export(spark, store, args.to, fmt=args.format, mode=jobs.ExportMode(args.mode),
                             options=options, say=_say)
        print(f"wrote {result.rows} messages to {result.path} ({len(result.partitions)} "
              "topic/date partitions)")
        return CliExit.OK
    if args.job == "check":
        report = jobs.check(spark, store, say=_say)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            print(f"checked {report.records} records ({report.bytes} bytes), {report.cq_entries} "
                  f"consume-queue entries, {report.index_entries} index entries")
            for finding in report.findings:
                print(f"  {finding}")
            print(f"{len(report.findings)} finding(s)" if report.findings else "store is consistent")
        return CliExit.OK if report.ok else CliExit.FAILED
    if args.job == "rebuild":
        report = jobs.rebuild(spark, store, say=_say)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            print(f"rebuilt {report.queues} consume queues ({report.cq_entries} entries) and "
                  f"{sum(report.index_keys.values())} index keys in {sum(report.index_files.values())} "
                  f"files up to commit_pos {report.data_end_pos} in {report.duration_s:.1f} s")
        return CliExit.OK
    report = jobs.stats(spark, store, plot_path=args.plot, options=options, say=_say)
    print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else _stats_text(report))
    return CliExit.OK


def _stats_text(report) -> str:
    lines = [f"{report.records} messages, {report.bytes} bytes"]
    lines += [f"  {t['topic']}: {t['messages']} messages, {t['bytes']} bytes, {t['distinct_keys']} "
              f"distinct keys" for t in report.topics]
    lines += [f"    queue {q['topic']}/{q['queue_id']}: {q['messages']} messages, {q['bytes']} bytes"
              for q in report.queues]
    lines += [f"  size {h['from_bytes']}..{h['to_bytes']}: {h['count']}" for h in report.size_histogram]
    if report.plot_path:
        lines.append(f"chart: {report.plot_path}")
    return "\n".join(lines)

"""Python functions run on the executors through DataFrames only (a Python UDTF over a table
argument), never RDDs or `sparkContext`: Spark Connect sessions have neither, and the jobs
must run over Connect too. (`mapInArrow` would also do, but needs pandas on the driver.)
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence

MAX_SLICES = 64


def _udtf(fn: Callable[[tuple], Iterable[tuple]], ddl: str):
    from pyspark.sql.functions import udtf

    class FlatMap:
        def eval(self, row) -> Iterator[tuple]:
            yield from fn(tuple(row))

    return udtf(FlatMap, returnType=ddl, useArrow=False)


def flat_map(df, fn: Callable[[tuple], Iterable[tuple]], ddl: str):
    """A DataFrame (schema `ddl`) of fn(row) for every row of `df`, rows as tuples in column order."""
    return _udtf(fn, ddl)(df.asTable())


def flat_map_items(spark, items: Sequence[tuple], item_ddl: str, fn: Callable[[tuple], Iterable[tuple]],
                   ddl: str):
    """flat_map over local `items`, spread over up to MAX_SLICES tasks."""
    df = spark.createDataFrame(list(items), item_ddl).repartition(max(1, min(len(items), MAX_SLICES)))
    return flat_map(df, fn, ddl)


def _call(fn: Callable, item: tuple) -> Iterator[tuple]:
    index, arg = item
    yield index, pickle.dumps(fn(pickle.loads(arg)))


def run_tasks(spark, fn: Callable, args: Sequence[object]) -> list:
    """[fn(arg) for arg in args], each call an executor task (arguments and results pickled)."""
    items = [(i, pickle.dumps(arg)) for i, arg in enumerate(args)]
    df = spark.createDataFrame(items, "i int, arg binary").repartition(max(1, len(items)), "i")
    rows = flat_map(df, functools.partial(_call, fn), "i int, result binary").collect()
    return [pickle.loads(r.result) for r in sorted(rows, key=lambda r: r.i)]

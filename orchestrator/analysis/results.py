"""A run's results as data: `results/instances.parquet` (one row per instance) and
`results/measures.parquet` (every number of the report, long format, unrounded).

The report is rendered from `measures.parquet` as read back from disk (`read_tables`), so the
file and the report cannot disagree. A table of the analysis becomes one long row per (row of the
table, number column): `table`, `position` (the row's place in its table), the row's text columns
as keys (`cell`, `floor`, `group`, ...), `measure` (the column), `value`, and `lo`/`hi` when the
column has an interval beside it. Rows with no number keep one line with an empty measure. The
parquet schema's metadata holds each table's layout (columns, dtypes, index, intervals) so
`read_tables` rebuilds the tables exactly.

Pure apart from the two file functions at the end; nothing here computes a measure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.errors import ConfigError

LONG = ("table", "position", "measure", "value", "lo", "hi")
METADATA_KEY = b"carc.tables"
FORMAT = 1
INSTANCES = "instances.parquet"
MEASURES = "measures.parquet"


def interval_of(name: str, columns: Sequence[str],
                overrides: Mapping[str, tuple[str, str]] | None = None) -> tuple[str, str] | None:
    """The (lo, hi) columns that bound column `name`: `x_lo`/`x_hi` for `x`, `lo`/`hi` for
    `mean`, `x_lo`/`x_hi` for `x_mean`; or the table's own `overrides`. None without both."""
    if overrides and name in overrides:
        return overrides[name]
    candidates = [(f"{name}_lo", f"{name}_hi")]
    if name == "mean":
        candidates.append(("lo", "hi"))
    if name.endswith("_mean"):
        candidates.append((f"{name[:-5]}_lo", f"{name[:-5]}_hi"))
    return next((pair for pair in candidates if all(p in columns for p in pair)), None)


def _plain(df: pd.DataFrame) -> bool:
    index = df.index
    return (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
            and index.name is None)


def _is_number(series: pd.Series) -> bool:
    return (pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)) \
        and not isinstance(series.dtype, pd.CategoricalDtype)


def _text(value: Any) -> str | None:
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return None
    return value if isinstance(value, str) else str(value)


def to_long(tables: Mapping[str, pd.DataFrame],
            intervals: Mapping[str, Mapping[str, tuple[str, str]]] | None = None
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Every table as long rows (see the module), and the layout that rebuilds them. `intervals`
    names, per table, bounds that do not follow the `x_lo`/`x_hi` naming."""
    layouts: dict[str, Any] = {}
    parts: list[pd.DataFrame] = []
    for name, table in tables.items():
        index = None if _plain(table) else list(table.index.names)
        flat = table if index is None else table.reset_index()
        labels = list(flat.columns)
        columns = [str(c) for c in labels]
        if len(set(columns)) != len(columns):
            raise ValueError(f"table {name}: column names repeat as text: {columns}")
        flat = flat.set_axis(columns, axis=1)
        numbers = [c for c in columns if _is_number(flat[c])]
        # an empty table has no long rows: its columns only need their dtypes back
        keys = [c for c in columns if c not in numbers] if len(flat) else []
        if set(keys) & set(LONG):
            raise ValueError(f"table {name}: a text column is named like a long column: "
                             f"{sorted(set(keys) & set(LONG))}")
        bounds = {c: interval_of(c, numbers, (intervals or {}).get(name)) for c in numbers}
        bounds = {c: pair for c, pair in bounds.items() if pair is not None}
        hidden = {p for pair in bounds.values() for p in pair}
        shown = [c for c in numbers if c not in hidden]
        layouts[name] = {
            "columns": columns, "labels": [_json_label(v) for v in labels],
            "dtypes": {c: str(flat[c].dtype) for c in columns}, "index": index,
            "keys": keys, "intervals": bounds, "rows": len(flat),
            "column_dtype": str(table.columns.dtype), "column_name": _json_label(table.columns.name)}
        key_values = {k: [_text(v) for v in flat[k]] for k in keys}
        positions = np.arange(len(flat), dtype="int64")
        if not shown:
            parts.append(pd.DataFrame({"table": name, "position": positions, **key_values,
                                       "measure": None, "value": np.nan, "lo": np.nan,
                                       "hi": np.nan}))
            continue
        for column in shown:
            pair = bounds.get(column)
            parts.append(pd.DataFrame({
                "table": name, "position": positions, **key_values, "measure": column,
                "value": _floats(flat[column]),
                "lo": _floats(flat[pair[0]]) if pair else np.nan,
                "hi": _floats(flat[pair[1]]) if pair else np.nan}))
    key_columns = list(dict.fromkeys(k for layout in layouts.values() for k in layout["keys"]))
    columns = ["table", "position", *key_columns, "measure", "value", "lo", "hi"]
    if not parts:
        return pd.DataFrame(columns=columns), {"format": FORMAT, "tables": layouts}
    long = pd.concat([p for p in parts if len(p)] or [pd.DataFrame(columns=columns)],
                     ignore_index=True).reindex(columns=columns)
    for key in key_columns:
        long[key] = long[key].astype(object).where(long[key].notna(), None)
    long = long.sort_values(["table", "position"], kind="stable", key=_table_order(tables))
    return long.reset_index(drop=True), {"format": FORMAT, "tables": layouts}


def _table_order(tables: Mapping[str, pd.DataFrame]):
    rank = {name: k for k, name in enumerate(tables)}

    def key(column: pd.Series) -> pd.Series:
        return column.map(rank) if column.name == "table" else column
    return key


def _floats(series: pd.Series) -> np.ndarray:
    return pd.to_numeric(series.astype(object).where(series.notna(), np.nan),
                         errors="coerce").to_numpy(dtype="float64")


def _json_label(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (int, float, str)) or value is None:
        return value
    return str(value)


def from_long(long: pd.DataFrame, layout: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """The tables `to_long` took apart, exactly: same columns, order, dtypes and index."""
    out = {}
    groups = dict(tuple(long.groupby("table", sort=False))) if len(long) else {}
    for name, spec in layout["tables"].items():
        rows = groups.get(name, long.iloc[0:0])
        n = spec["rows"]
        data: dict[str, Any] = {}
        for key in spec["keys"]:
            values = [None] * n
            if key in rows.columns:
                first = rows.drop_duplicates("position")
                for position, value in zip(first["position"], first[key]):
                    values[int(position)] = value
            data[key] = values
        for measure, part in rows.groupby("measure", sort=False) if len(rows) else ():
            positions = part["position"].to_numpy(dtype="int64")
            for column, source in [(measure, "value"), *zip(spec["intervals"].get(measure, ()),
                                                            ("lo", "hi"))]:
                values = np.full(n, np.nan)
                values[positions] = part[source].to_numpy(dtype="float64")
                data[column] = values
        frame = pd.DataFrame({c: data.get(c, [None] * n) for c in spec["columns"]})
        for column, dtype in spec["dtypes"].items():
            frame[column] = _restore(frame[column], dtype)
        frame.columns = spec["labels"]
        if spec["index"] is not None:
            frame = frame.set_index(spec["index"])
        frame.columns = frame.columns.astype(spec["column_dtype"]).rename(spec["column_name"])
        out[name] = frame
    return out


def _restore(series: pd.Series, dtype: str) -> pd.Series:
    if dtype in ("object", "str", "string"):
        return series.astype(object).where(series.notna(), None) if dtype == "object" \
            else series.astype(dtype)
    if dtype in ("int64", "int32", "bool"):
        return series.fillna(0).astype(dtype)
    if dtype == "boolean":
        return series.astype("Float64").astype("boolean")
    return series.astype(dtype)


# --- the instance table ------------------------------------------------------------------------

SETTINGS = ("cell", "label", "learner", "row", "model", "effort", "order", "seed", "track")
INSTANCE_COLUMNS = (
    *SETTINGS, "user", "round", "slot", "phase", "task", "visit", "exposure", "status",
    "failure_kind", "reason", "cost", "share", "solved", "pairs", "wrong_answers", "malformed",
    "first_submit_demos", "first_answer_correct", "wall_s", "calls", "retries", "errors",
    "input_tokens", "output_tokens", "usd", "model_s", "compute_source")


def instances_table(frame: pd.DataFrame, journal: pd.DataFrame) -> pd.DataFrame:
    """`results/instances.parquet` of every kind of run: one row per finished instance
    (`measures.instances_frame`) with its compute; `user` and `round` are a collective
    instance's, null in a grid cell. Calls, retries, errors, tokens, dollars and model seconds
    come from the proxy journal of the instance's (user and) slot when the cell has one
    (`compute_source` journal: every call, a harness's own and every retry included), else from
    the learner's own count (`learner`; retries and errors unknown)."""
    out = pd.DataFrame({c: frame[c] for c in (*SETTINGS, "user", "round", "slot", "phase",
                                               "task", "visit", "exposure", "status",
                                               "failure_kind", "reason", "cost", "share",
                                               "solved")})
    out[["user", "round"]] = out[["user", "round"]].astype("Int64")  # one dtype for both kinds
    out["pairs"] = frame["demos_used"]
    out["wrong_answers"] = frame["attempts_used"]
    for column in ("malformed", "first_submit_demos", "first_answer_correct", "wall_s"):
        out[column] = frame[column]
    journaled = set(journal["cell"]) if len(journal) else set()
    keys = ["cell", "user", "slot"]
    merged = out[keys].merge(journal.astype({"user": "Int64"}), on=keys, how="left")
    in_journal = out["cell"].isin(journaled).to_numpy()

    def pick(journal_column: str, learner: pd.Series, dtype: str) -> pd.Series:
        values = np.where(in_journal, merged[journal_column].fillna(0).to_numpy(dtype="float64"),
                          learner.to_numpy(dtype="float64"))
        return pd.Series(values, index=out.index).astype(dtype)
    nothing = pd.Series(np.nan, index=out.index)
    out["calls"] = pick("calls", frame["model_calls"], "int64")
    out["retries"] = pick("retries", nothing, "Int64")
    out["errors"] = pick("errors", nothing, "Int64")
    out["input_tokens"] = pick("prompt_tokens", frame["prompt_tokens"], "int64")
    out["output_tokens"] = pick("completion_tokens", frame["completion_tokens"], "int64")
    out["usd"] = pick("usd", frame["cost_usd"], "float64")
    out["model_s"] = pick("model_s", frame["model_s"], "float64")
    out["compute_source"] = np.where(in_journal, "journal", "learner")
    # text stays text when every value is missing (a run with no failure), so the schema is one
    text = [c for c in INSTANCE_COLUMNS if not _is_number(out[c])]
    out[text] = out[text].astype("str")
    return out.reset_index(drop=True)[list(INSTANCE_COLUMNS)]


# --- files -------------------------------------------------------------------------------------

def write_measures(path: Path, long: pd.DataFrame, layout: Mapping[str, Any]) -> None:
    """`measures.parquet` with the layout in its schema metadata; written whole, then renamed."""
    table = pa.Table.from_pandas(long, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[METADATA_KEY] = json.dumps(layout).encode()
    _write_table(path, table.replace_schema_metadata(metadata))


def read_measures(path: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The long frame of a `measures.parquet` and its layout."""
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise ConfigError(f"{path}: no carc table layout in its metadata; rewrite it with "
                         "`carc report RUN`")
    return table.to_pandas(), json.loads(raw)


def read_tables(path: Path) -> dict[str, pd.DataFrame]:
    return from_long(*read_measures(path))


def write_instances(path: Path, frame: pd.DataFrame) -> None:
    _write_table(path, pa.Table.from_pandas(frame, preserve_index=False))


def _write_table(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def write_frame(frame: pd.DataFrame, path: Path) -> None:
    """A table as the suffix of `path` says: .parquet, .csv or .json (records)."""
    path = Path(path)
    if path.suffix not in (".parquet", ".csv", ".json"):
        raise ConfigError(f"{path}: give a file ending in .parquet, .csv or .json")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        _write_table(path, pa.Table.from_pandas(frame, preserve_index=False))
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        path.write_text(json_records(frame), encoding="utf-8")


def json_records(frame: pd.DataFrame) -> str:
    """A table as a JSON list of records whose numbers read back exactly: the stdlib encoder
    writes the shortest text that round-trips a double (pandas' `to_json` keeps 10 digits,
    15 at most). A missing or infinite value, which JSON cannot carry, is null."""
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return json.dumps([{str(k): None if isinstance(v, float) and not math.isfinite(v) else v
                        for k, v in record.items()} for record in records],
                      indent=1, allow_nan=False, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r} has no JSON form; give the column numbers, "
                    "text or booleans, or write .parquet")


def export(folder: Path, target: Path, format: str) -> list[Path]:
    """The run's two tables from `folder` (its results/) into `target` in `format`; returns the
    paths. Parquet into the results folder itself writes nothing new."""
    written = []
    for name in (INSTANCES, MEASURES):
        source = folder / name
        path = Path(target) / Path(name).with_suffix(f".{format}").name
        if format == "parquet" and path.resolve() == source.resolve():
            written.append(path)
            continue
        if format == "parquet":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(source.read_bytes())
        else:
            write_frame(pd.read_parquet(source), path)
        written.append(path)
    return written

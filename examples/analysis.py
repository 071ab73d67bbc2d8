#!/usr/bin/env python3
"""Analyse recorded GABP sessions with DuckDB and Polars, from one Parquet export.

    gabp-relay export --all --format parquet -o sessions/      # or --route, --since, --tag
    gabp-relay stats  --all --json > stats.json                # the same selection
    python examples/analysis.py sessions/ stats.json

Both libraries read the Hive-partitioned directory (route=R/date=D/session=ID.parquet) with
one glob. DuckDB counts events per channel, Polars pairs tool calls with their answers for
latency percentiles; every figure is checked against `gabp-relay stats --json` for the same
sessions (stats keeps latencies in a log-linear histogram, exact to 1/16), and a short summary
is printed. Exit status 1 and one line per disagreement when anything differs.

Needs `pip install duckdb polars` (no pyarrow, no pandas).
"""

import json
import math
import sys

import duckdb
import polars as pl

# stats' latency histogram keeps 2 significant figures (the report's): within 1 %.
TOLERANCE = 1 / 100
QUANTILES = {"p50Ms": 0.5, "p90Ms": 0.9, "p99Ms": 0.99}


def load_stats(path):
    """`stats --json` of one session (an object) or of a selection ({"sessions": [...]})."""
    with (sys.stdin if path == "-" else open(path, encoding="utf-8")) as f:
        doc = json.load(f)
    sessions = doc["sessions"] if "sessions" in doc else [doc]
    return {s["session"]: s for s in sessions}


def nearest_rank(sorted_values, q):
    """The q-quantile as stats defines it: the value of rank ceil(q * n)."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def main(argv):
    if len(argv) != 3:
        print("usage: analysis.py EXPORT_DIR STATS_JSON", file=sys.stderr)
        return 2
    export_dir, stats_path = argv[1].rstrip("/"), argv[2]
    glob = f"{export_dir}/**/*.parquet"
    stats = load_stats(stats_path)
    problems = []

    # --- DuckDB: sessions, frames and events per channel ---
    db = duckdb.connect()
    quoted = glob.replace("'", "''")
    db.execute(f"CREATE VIEW frames AS SELECT * FROM read_parquet('{quoted}', hive_partitioning = true)")
    sessions = {
        s: (route, frames)
        for s, route, frames in db.execute(
            "SELECT session, any_value(route), count(*) FROM frames GROUP BY session"
        ).fetchall()
    }
    if set(sessions) != set(stats):
        problems.append(
            f"sessions differ: export has {len(sessions)}, stats {len(stats)}, "
            f"in common {len(set(sessions) & set(stats))}"
        )
    counts = {
        (s, c if c is not None else "?"): n
        for s, c, n in db.execute(
            "SELECT session, channel, count(*) FROM frames "
            "WHERE kind = 'event' AND dir = 'mod->relay' GROUP BY ALL"
        ).fetchall()
    }
    expected = {
        (s, c["channel"]): c["events"]
        for s, st in stats.items()
        for c in st["channels"]
    }
    for key in sorted(set(counts) | set(expected)):
        got, want = counts.get(key, 0), expected.get(key, 0)
        if got != want:
            problems.append(f"events of {key[1]} in {key[0]}: export {got}, stats {want}")

    # --- Polars: the same files, tool calls paired with their answers ---
    lf = pl.scan_parquet(glob, hive_partitioning=True)
    total = lf.select(pl.len()).collect().item()
    if total != sum(f for _, f in sessions.values()):
        problems.append(f"Polars read {total} rows, DuckDB {sum(f for _, f in sessions.values())}")
    sent = lf.filter((pl.col("dir") == "relay->mod") & (pl.col("kind") == "request")).select(
        "session", "id", "conn", "method", pl.col("t_ns").alias("sent")
    )
    # An answer is the one routed back to the caller's conn: one that came after the caller
    # was told -32001 (past --request-timeout) is recorded with conn 0 and answers nothing.
    answered = lf.filter((pl.col("dir") == "mod->relay") & (pl.col("kind") == "response")).select(
        "session", "id", "conn", pl.col("t_ns").alias("answered")
    )
    calls = (
        sent.join(answered, on=["session", "id", "conn"], how="left")
        .with_columns(
            ((pl.col("answered") - pl.col("sent")).dt.total_nanoseconds().clip(lower_bound=1)).alias("ns")
        )
        .group_by("session", "method")
        .agg(pl.len().alias("calls"), pl.col("ns").drop_nulls().sort().alias("ns"))
        .collect()
    )
    latencies = {}
    for row in calls.iter_rows(named=True):
        key = (row["session"], row["method"] or "?")
        latencies[key] = (row["calls"], row["ns"])
    for s, st in stats.items():
        for m in st["methods"]:
            calls_n, ns = latencies.get((s, m["method"]), (0, []))
            if calls_n != m["calls"]:
                problems.append(f"calls of {m['method']} in {s}: export {calls_n}, stats {m['calls']}")
                continue
            for field, q in QUANTILES.items():
                if not ns:
                    # No answered call: stats has no latency to give (null), not 0 ms.
                    if m[field] is not None:
                        problems.append(f"{field} of {m['method']} in {s}: no answered call, stats {m[field]}")
                    continue
                exact = nearest_rank(ns, q) / 1e6
                if abs(m[field] - exact) > exact * TOLERANCE + 1e-6:
                    problems.append(
                        f"{field} of {m['method']} in {s}: export {exact:.3f} ms, stats {m[field]:.3f} ms"
                    )
    for s, m in latencies:
        if s in stats and not any(x["method"] == m for x in stats[s]["methods"]):
            problems.append(f"method {m} in {s} is in the export only")

    # --- summary ---
    routes = sorted({r for r, _ in sessions.values()})
    print(f"{len(sessions)} sessions on {len(routes)} routes ({', '.join(routes)}), {total} frames")
    for channel, n in db.execute(
        "SELECT channel, count(*) FROM frames WHERE kind = 'event' AND dir = 'mod->relay' "
        "GROUP BY ALL ORDER BY 2 DESC, 1"
    ).fetchall():
        print(f"  events {channel}: {n}")
    everything = (
        calls.explode("ns").drop_nulls("ns").group_by("method").agg(pl.col("ns").sort()).sort("method")
    )
    for row in everything.iter_rows(named=True):
        ns = row["ns"]
        p = {f: nearest_rank(ns, q) / 1e6 for f, q in QUANTILES.items()}
        print(
            f"  calls {row['method']}: {len(ns)} answered, "
            f"p50 {p['p50Ms']:.2f} ms, p90 {p['p90Ms']:.2f} ms, p99 {p['p99Ms']:.2f} ms"
        )
    marks = db.execute("SELECT count(*) FROM frames WHERE kind = 'mark'").fetchone()[0]
    print(f"  marks: {marks}")
    if problems:
        for p in problems:
            print(f"MISMATCH {p}", file=sys.stderr)
        return 1
    print("export and stats agree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

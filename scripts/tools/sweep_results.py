#!/usr/bin/env python3
"""Load a sweep's results table (results.h5, written by `sparsim collect SPEC`) into pandas.

  scripts/tools/sweep_results.py OUT/results.h5                 # print the table
  scripts/tools/sweep_results.py OUT/results.h5 --check-csv OUT/results.csv

As a module:

  from sweep_results import load
  df = load("out/sweeps/demo/results.h5")
  df[df.method == "teal"][["sparsity", "sparsity_realised", "perplexity"]]

results.h5 holds one 1-D dataset per column under /results (strings as UTF-8) and the column
order in /columns; results.csv has the same columns. --check-csv checks that both files hold
the same table (numbers exactly: the CSV writes shortest round-trip decimals).
"""
import argparse
import sys

import h5py
import numpy as np
import pandas as pd


def load(path):
    with h5py.File(path, "r") as f:
        cols = [c.decode() if isinstance(c, bytes) else str(c) for c in f["columns"][()]]
        g = f["results"]
        data = {}
        for c in cols:
            d = g[c]
            data[c] = d.asstr()[()] if h5py.check_string_dtype(d.dtype) else d[()]
    return pd.DataFrame(data, columns=cols)


def check_csv(df, csv_path):
    csv = pd.read_csv(csv_path, keep_default_na=False, na_values=[""], dtype=str)
    if list(csv.columns) != list(df.columns):
        return f"columns differ: {list(csv.columns)} vs {list(df.columns)}"
    if len(csv) != len(df):
        return f"{len(csv)} CSV rows, {len(df)} HDF5 rows"
    for c in df.columns:
        for i, (a, b) in enumerate(zip(df[c], csv[c])):
            if isinstance(a, str):
                same = a == ("" if pd.isna(b) else b)
            elif isinstance(a, (float, np.floating)) and np.isnan(a):
                same = pd.isna(b)
            else:
                same = not pd.isna(b) and type(a)(float(b) if isinstance(a, (float, np.floating))
                                                  else int(b)) == a
            if not same:
                return f"row {i} column {c}: {a!r} (HDF5) vs {b!r} (CSV)"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--check-csv", help="results.csv to compare with the HDF5 table")
    args = ap.parse_args()
    df = load(args.results)
    if args.check_csv:
        err = check_csv(df, args.check_csv)
        if err:
            sys.exit("results.h5 and results.csv differ: " + err)
        print(f"{len(df)} rows, {len(df.columns)} columns: results.h5 and results.csv agree")
        return
    with pd.option_context("display.max_columns", None, "display.width", 200):
        print(df)


if __name__ == "__main__":
    main()

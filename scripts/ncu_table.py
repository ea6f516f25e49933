"""Condense ``ncu --csv --page raw`` output (stdin) into one line per kernel launch: the
kernel's short name, grid, block and the metrics named on the command line (comma
separated, as given to ncu's ``--metrics``; GPU, with Nsight Compute).

    ncu --csv --page raw --metrics $M python scripts/probe_reduce_l2.py \\
        | python scripts/ncu_table.py $M
"""

from __future__ import annotations

import csv
import re
import sys


def main() -> None:
    lines = [line for line in sys.stdin if line.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        print("no ncu rows")
        return
    head, units, data = rows[0], rows[1], rows[2:]
    at = {name: i for i, name in enumerate(head)}
    metrics = [at[name] for name in sys.argv[1].split(",") if name in at]
    print(" | ".join(["kernel", "grid", "block"]
                     + [f"{head[i]} ({units[i]})" for i in metrics]))
    for row in data:
        name = re.sub(r"\[abi:[^\]]*\]|\(.*", "", row[at["Kernel Name"]])
        name = name.split("::")[-1][:48]
        cells = [name, row[at["Grid Size"]], row[at["Block Size"]]]
        print(" | ".join(cells + [row[i] for i in metrics]))


if __name__ == "__main__":
    main()

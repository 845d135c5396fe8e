"""Lines of code a learner scrolls past before a cell: the unfolded code cells above it.

    python scripts/lines_before.py notebooks/11_training.ipynb <cell id> [<cell id> ...] [--rev REV]

Folded cells (`jupyter.source_hidden`) are not counted: they show as one line. With --rev, the same
count on the notebook as it was at that git revision, for a before/after comparison (issue 18).
"""
import argparse
import json
import subprocess
import sys


def lines_before(notebook: dict, cell_id: str) -> int:
    count = 0
    for cell in notebook["cells"]:
        if cell.get("id") == cell_id:
            return count
        if cell["cell_type"] == "code" and not cell["metadata"].get("jupyter", {}).get("source_hidden"):
            count += len("".join(cell["source"]).splitlines())
    raise SystemExit(f"error: no cell with id {cell_id!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook")
    parser.add_argument("cell_ids", nargs="+")
    parser.add_argument("--rev", help="also count at this git revision (e.g. HEAD~3)")
    args = parser.parse_args()
    with open(args.notebook, encoding="utf-8") as file:
        now = json.load(file)
    then = None
    if args.rev:
        shown = subprocess.run(["git", "show", f"{args.rev}:{args.notebook}"], capture_output=True, text=True)
        if shown.returncode:
            sys.exit(f"error: {args.notebook} is not in git revision {args.rev}")
        then = json.loads(shown.stdout)
    for cell_id in args.cell_ids:
        before = f"{lines_before(then, cell_id)} at {args.rev}, " if then else ""
        print(f"{args.notebook} cell {cell_id}: {before}{lines_before(now, cell_id)} now")


if __name__ == "__main__":
    main()

"""``python -m kernels.course_lab build`` and ``python -m kernels.course_lab grade <folder>``."""

from __future__ import annotations

import argparse
import sys

from .course import DEFAULT_OUT, build, grade, hide_solutions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernels.course_lab",
        description="Student notebooks and an nbgrader autograder made from the book's chapters.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="make the student notebooks and the autograder")
    b.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: %(default)s)")
    b.add_argument("--chapters", nargs="*", help="chapter numbers, e.g. 1 2 3 (default: all)")
    b.add_argument(
        "--ref",
        help="branch or tag the student notebooks clone on Colab "
        "(default: the branch in _config.yml)",
    )
    b.add_argument(
        "--force", action="store_true", help="rebuild even if the course holds graded submissions"
    )
    g = sub.add_parser(
        "grade",
        help="autograde <folder>/<student>/<notebook>.ipynb (each "
        "answer in a process of its own; grade in a sandbox)",
    )
    g.add_argument("submissions", help="folder with one subfolder per student")
    g.add_argument("--out", default=str(DEFAULT_OUT), help="the built kit (default: %(default)s)")
    h = sub.add_parser(
        "hide-solutions",
        help="edit book/*.ipynb in place so that the website "
        "shows no solutions (run it in a clone made for the course)",
    )
    h.add_argument("--book", default="book", help="the chapters' folder (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.out, args.chapters, args.ref, args.force)
        elif args.command == "hide-solutions":
            hide_solutions(args.book)
        else:
            grade(args.submissions, args.out)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

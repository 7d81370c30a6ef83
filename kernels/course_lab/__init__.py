"""The course-lab kit: student notebooks and an autograder made from the book's chapters.

One command, ``python -m kernels.course_lab build``, turns every chapter into an nbgrader
assignment: the chapter notebook in ``book/`` is the only source; the student version (answers
blank, checks kept, hidden tests held back, folded solutions removed) and the autograder
(nbgrader's course directory with the hidden tests and points) are generated into the
git-ignored ``_build/lab/``. ``python -m kernels.course_lab grade <folder>`` grades submissions:
every answer in a fresh process of its own, the checks in the grader's.
The instructor's page of the book (``book/instructor.md``) says how to use it.

* :mod:`.notebook`  what a chapter's exercise cells look like (tags), their labels (the keys of
  the points table and the grader's tables) and displayed numbers, and the nbgrader source
  notebook made from a chapter
* :mod:`.course`    the nbgrader course: :func:`build`, :func:`grade`, the student setup cell
* :mod:`.grading`   grading one notebook: its chapter's plans, each answer's score
* :mod:`.batch`     grading a folder of submissions: files found, duplicates, CSVs merged,
  feedback pages
* :mod:`.sandbox`   where the answers run: own user, hidden folders, no network, limits,
  time budgets
* :mod:`.isolate`   a student's answer in a worker process; values cross as plain data
  (:mod:`.codec`); what an answer may not do is :func:`kernels.exercise_rules.scan`, which the
  checks use too
* :mod:`.worker`    the script that forks the workers, without the book's package
* :mod:`.class_timing` how long grading a class takes (the instructor page quotes it)
* :mod:`.text`      the chapters' Markdown made readable in Jupyter and Colab, for students
"""

from .course import DEFAULT_OUT, build, grade, student_setup
from .notebook import Exercise, chapter_number, clear_solution, exercises, student_source

__all__ = [
    "DEFAULT_OUT",
    "build",
    "grade",
    "student_setup",
    "Exercise",
    "chapter_number",
    "clear_solution",
    "exercises",
    "student_source",
]

"""python -m aiayn.course: the course's command line (aiayn/course/assignments.py)."""

from aiayn.course.assignments import main

raise SystemExit(main())

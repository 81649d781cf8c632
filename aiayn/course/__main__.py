"""python -m aiayn.course: the course's command line (aiayn/course/assignments.py)."""

import sys

from aiayn.course.assignments import main

sys.exit(main())

"""The course's apparatus: exercises and self-checks, widgets, figures, the map, source listings, the notebook copier,
the pre-flight doctor and the articles' claims with their checks. Nothing outside this folder imports it.

Kept to the standard library at import time: `python -m qwenvl_lab.course.doctor` runs before anything is installed.
"""
